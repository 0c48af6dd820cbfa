"""Exceptions raised by the storage layer."""

from __future__ import annotations


class StoreError(Exception):
    """Base class: the store could not do what was asked."""


class StoreFormatError(StoreError):
    """The data dir was written by an incompatible on-disk format version.

    Refusing to start is safer than guessing at bytes we do not understand.
    """

    def __init__(self, what: str, found: int, expected: int) -> None:
        super().__init__(
            f"{what}: on-disk format version {found} is not supported "
            f"(this Leveret expects version {expected})"
        )
        self.found = found
        self.expected = expected


class StoreWriteError(StoreError):
    """A write was not made durable because an earlier write or fsync failed."""
