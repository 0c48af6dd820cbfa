"""Small crash-safe file operations shared by the store's side files."""

from __future__ import annotations

import os

from leveret.store import replica


def fsync_dir(path: str) -> None:
    """Make a rename or unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new one:
    a temp file, fsync, rename over, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    replica.replaced(path, data)
