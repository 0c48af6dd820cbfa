"""The follower writer's EIO test hook (`LEVERET_TEST_EIO_FILE`, used by
tests/partitions): off unless the variable is set, and then failing every write
while its file exists."""

from __future__ import annotations

import errno
import os

import pytest

from leveret.cluster import datadir


def test_without_the_variable_the_writer_is_the_plain_one(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(datadir.EIO_FILE_ENV, raising=False)
    applier = datadir.Applier(str(tmp_path), fsync=True)
    # nothing wrapped: the methods are the class's own
    assert not {"write", "replace", "truncate", "sync"} & set(vars(applier))
    applier.write("a/seg", 0, b"hello")
    applier.sync()
    applier.close()
    assert (tmp_path / "a" / "seg").read_bytes() == b"hello"


def test_writes_fail_with_eio_while_the_flag_file_exists(tmp_path, monkeypatch) -> None:
    flag = tmp_path / "eio"
    data = tmp_path / "data"
    monkeypatch.setenv(datadir.EIO_FILE_ENV, str(flag))
    applier = datadir.Applier(str(data), fsync=True)
    applier.write("seg", 0, b"one")
    applier.sync()
    flag.touch()
    for call in (
        lambda: applier.write("seg", 3, b"two"),
        lambda: applier.replace("file", b"x"),
        lambda: applier.truncate("seg", 1),
        applier.sync,
    ):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EIO
    os.unlink(flag)
    applier.write("seg", 3, b"two")
    applier.sync()
    applier.close()
    assert (data / "seg").read_bytes() == b"onetwo"
