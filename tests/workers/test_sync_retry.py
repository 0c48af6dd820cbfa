"""A worker's sync with worker 0 that fails with an error other than a lost link:
tried again with a capped backoff, given up after `SYNC_TRIES` tries (the worker
exits and is restarted), and a refused sync stops the broker with its reason.

The failures are injected with the metadata's test hook (`SYNC_FAULTS_ENV`: a file
that says how many syncs fail next, or `refuse`), in real `leveret server --workers 2`
processes; the writer's own refusal (a worker of another count) and the retry loop's
rules run on two meshes in one process."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from leveret.workers.mesh import local_meshes
from leveret.workers.metadata import SYNC_FAULTS_ENV, SYNC_TRIES, Metadata, SyncRefused
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


@linux
def test_a_start_whose_first_syncs_fail_serves_once_one_succeeds(
    workers, tmp_path, monkeypatch
) -> None:
    faults = tmp_path / "sync-faults"
    faults.write_text("3")
    monkeypatch.setenv(SYNC_FAULTS_ENV, str(faults))
    broker = workers(2).wait_listening()
    text = broker.text()
    assert faults.read_text() == "0"  # three syncs failed, the fourth went through
    # once per distinct error, with what happens next
    assert text.count("could not sync with worker 0") == 1, text
    assert "(sync: test fault); trying again with a backoff" in text
    assert "worker 1 synced with worker 0 after 3 failed tries" in text
    assert broker.status()["workers"][1]["restarts"] == 0
    conn = broker.connect("wk-resilience-sync")
    conn.channel().queue_declare("wk-resilience-sync-q")
    conn.close()


@linux
def test_a_worker_that_cannot_sync_in_its_tries_is_restarted_and_syncs_afresh(
    workers, tmp_path, monkeypatch
) -> None:
    faults = tmp_path / "sync-faults"
    faults.write_text(str(SYNC_TRIES))  # every try of the first process fails
    monkeypatch.setenv(SYNC_FAULTS_ENV, str(faults))
    broker = workers(2).wait_listening()
    text = broker.text()
    assert f"{SYNC_TRIES} tries in a row failed" in text, text
    assert "giving up (a restart of this worker syncs afresh)" in text
    assert "exited (exit status 3), restart 1" in text
    w = broker.status()["workers"][1]
    assert w["restarts"] == 1 and w["ready"]
    assert broker.stop() == 0


@linux
def test_a_refused_sync_stops_the_broker_with_its_reason(workers, tmp_path, monkeypatch) -> None:
    faults = tmp_path / "sync-faults"
    faults.write_text("refuse")
    monkeypatch.setenv(SYNC_FAULTS_ENV, str(faults))
    broker = workers(2)
    assert broker.proc.wait(timeout=120) == 1
    text = broker.text()
    assert (
        "worker 1 cannot sync with worker 0: worker 0 refused its sync: refused (test fault)"
        in text
    ), text
    assert "no restart can mend it, stopping all" in text
    assert "Leveret listening" not in text
    assert broker.status()["workers"][1]["state"] == "failed"


class _Broker:
    """Just enough of a broker for `Metadata.start` and a sync: no vhosts."""

    def __init__(self) -> None:
        self.vhosts: dict = {}
        self.vhost_watchers: list = []
        self.admin = _Anything()
        self.global_parameters = _Anything()


class _Anything:
    def __getattr__(self, name: str):
        return lambda *a, **k: None


def test_worker_0_refuses_a_worker_of_another_count() -> None:
    async def main() -> None:
        meshes = await local_meshes(2)
        writer = Metadata(_Broker, meshes[0])
        await writer.start()
        with pytest.raises(SyncRefused, match="runs as one of 3 workers, worker 0 as one of 2"):
            await meshes[1].call(0, "sync", [], 3)
        for mesh in meshes:
            mesh.close()

    asyncio.run(main())


def test_retries_log_each_distinct_error_once_and_give_up_after_the_tries(caplog) -> None:
    async def main() -> tuple[list, int]:
        meshes = await local_meshes(2)
        writer = Metadata(_Broker, meshes[0])
        await writer.start()
        errors = iter([OSError("disk"), OSError("disk"), ValueError("odd"), OSError("disk")] * 3)

        def failing(peer: int, claims: list, count: int | None = None, transient=None):
            raise next(errors)

        meshes[0].serve("sync", failing)
        follower = Metadata(_Broker, meshes[1])
        follower.sync_retry_first = follower.sync_retry_cap = 0.001
        follower.sync_tries = 6
        given_up: list = []
        follower.sync_failures.append(
            lambda reason, permanent: given_up.append((reason, permanent))
        )
        await follower.start()
        await asyncio.wait_for(follower._sync_task, 10)
        for mesh in meshes:
            mesh.close()
        return given_up, follower.in_sync

    with caplog.at_level(logging.ERROR, "leveret.workers.metadata"):
        given_up, in_sync = asyncio.run(main())
    assert not in_sync
    assert given_up == [("6 tries in a row failed, the last with OSError: disk", False)]
    retried = [r.getMessage() for r in caplog.records if "could not sync" in r.getMessage()]
    assert len(retried) == 2, retried  # OSError: disk, and ValueError: odd, once each
    assert "(try 1): OSError: disk" in retried[0] and "(try 3): ValueError: odd" in retried[1]
