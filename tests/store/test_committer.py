"""GroupCommitter: fsync modes, callbacks on the loop after the fsync, clean shutdown."""

from __future__ import annotations

import asyncio
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
