"""GroupCommitter: fsync modes, callbacks on the loop after the fsync, clean shutdown."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from leveret.store import committer as committer_mod
from leveret.store.committer import GroupCommitter, segment_path


def test_callbacks_run_on_loop_after_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_sync = committer_mod._sync_file

    def sync(fd: int) -> None:
        real_sync(fd)
        events.append("sync")

    monkeypatch.setattr(committer_mod, "_sync_file", sync)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        c = GroupCommitter(str(tmp_path), "batch", loop)
        threads: set[threading.Thread] = set()
        futs = []
        for i in range(100):
            fut = loop.create_future()

            def cb(exc: BaseException | None, fut: asyncio.Future = fut) -> None:
                threads.add(threading.current_thread())
                events.append("cb")
                fut.set_result(exc)

            c.submit([(1, i * 4, (b"abcd",))], cb)
            futs.append(fut)
        assert await asyncio.gather(*futs) == [None] * 100
        assert threads == {threading.current_thread()}
        assert events.index("sync") < events.index("cb")
        assert c.syncs < 100  # batched
        c.close()

    asyncio.run(scenario())
    assert Path(segment_path(str(tmp_path), 1)).read_bytes() == b"abcd" * 100


def test_always_mode_syncs_every_submit(tmp_path: Path) -> None:
    c = GroupCommitter(str(tmp_path), "always")
    done: list[BaseException | None] = []
    for i in range(30):
        c.submit([(1, i, (b"x",))], done.append)
    c.drain()
    assert done == [None] * 30 and c.syncs == 30
    c.close()


def test_never_mode_does_not_sync_and_close_drains(tmp_path: Path) -> None:
    c = GroupCommitter(str(tmp_path), "never")
    done: list[BaseException | None] = []
    for i in range(10):
        c.submit([(2, i * 2, (b"y", b"z"))], done.append)
    c.close()
    assert done == [None] * 10 and c.syncs == 0
    assert Path(segment_path(str(tmp_path), 2)).read_bytes() == b"yz" * 10


def test_bad_mode_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        GroupCommitter(str(tmp_path), "sometimes")


def test_stream_fsyncs_share_the_writer_thread_once_per_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit_sync: another log's descriptors are fsynced in the writer's batch, each
    once however many waiters share it; a bad descriptor fails only its own waiters."""
    synced: list[int] = []
    real_sync = committer_mod._sync_file

    def sync(fd: int) -> None:
        real_sync(fd)
        synced.append(fd)

    monkeypatch.setattr(committer_mod, "_sync_file", sync)
    stream_file = tmp_path / "stream.seg"
    fd = os.open(stream_file, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"record")
    closed = 65_000  # a descriptor that is not open: its fsync fails (EBADF)
    c = GroupCommitter(str(tmp_path / "store"), "batch")
    threads: set[str] = set()
    done: list[tuple[str, BaseException | None]] = []
    c.submit([(1, 0, (b"abcd",))], lambda e: done.append(("store", e)))
    for i in range(5):
        c.submit_sync([fd], lambda e, i=i: done.append((f"stream{i}", e)))
    c.submit_sync([closed], lambda e: done.append(("bad", e)))
    c.submit_sync([fd], lambda e: (threads.add(threading.current_thread().name), None)[1])
    c.drain()
    c.close()
    os.close(fd)
    results = dict(done)
    assert results["store"] is None  # the store's own write is not touched by the bad fd
    assert all(results[f"stream{i}"] is None for i in range(5))
    assert isinstance(results["bad"], OSError)
    assert synced.count(fd) <= 2  # one per batch, not one per waiter (6 waiters)
    assert threads == {"leveret-store-writer"}  # no loop given: run on the writer thread


def test_stream_fsync_follows_never_mode(tmp_path: Path) -> None:
    c = GroupCommitter(str(tmp_path), "never")
    fd = os.open(tmp_path / "s.seg", os.O_WRONLY | os.O_CREAT)
    done: list[BaseException | None] = []
    c.submit_sync([fd], done.append)
    c.drain()
    c.close()
    os.close(fd)
    assert done == [None] and c.syncs == 0
