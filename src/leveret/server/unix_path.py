"""Unix socket paths longer than the kernel takes.

`sun_path` holds 108 bytes on Linux, so a socket in a data dir deep in a CI workspace,
a pytest temporary directory or a home directory with long names cannot be bound or
reached by its path ("AF_UNIX path too long"). The broker's control socket and a
cluster node's live in the data dir, wherever the operator put it, so such a path
must not stop the broker from starting.

`short_path(path)` gives a path to the same file that fits: `/proc/self/fd/N/name`,
where N is a descriptor of the socket's directory, open for as long as the `with`
block lasts. Binding, connecting, `chmod` and `unlink` through it act on the real
directory. Only the socket file is reached this way; its directory stays where the
operator put it. Where /proc is missing (not Linux), the long path is returned as it
is and the call fails, naming the path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# sun_path is 108 bytes with its terminating NUL
MAX_UNIX_PATH = 107
_PROC_FDS = "/proc/self/fd"


@contextmanager
def short_path(path: str) -> Iterator[str]:
    """A path to `path` no longer than MAX_UNIX_PATH bytes, valid inside the block."""
    if len(os.fsencode(path)) <= MAX_UNIX_PATH or not os.path.isdir(_PROC_FDS):
        yield path
        return
    directory, name = os.path.split(os.path.abspath(path))
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        short = f"{_PROC_FDS}/{fd}/{name}"
        yield short if len(os.fsencode(short)) <= MAX_UNIX_PATH else path
    finally:
        os.close(fd)
