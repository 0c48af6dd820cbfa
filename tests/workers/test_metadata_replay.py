"""The recorded parity tables replayed against a broker of two workers: the AMQP
scenarios (tests/compat/amqp: what RabbitMQ 3.10.8 answered) through worker 1, and
the management API's table (tests/compat/http) through worker 0.

Every queue is placed on worker 1, the clients' worker, so that no message has to
cross workers (that is the data path's part, tested on its own): what this replay
checks is the metadata path. Each declaration, binding and deletion goes to worker
0, which checks it against its own model, where worker 1's queues are stand-ins
(RemoteQueue), applies it and sends it back to worker 1 before the client gets its
answer; every refusal must read as RabbitMQ's, with the allow-list of the
one-process replay and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.compat.amqp.allowed import ALLOWED
from tests.compat.amqp.runner import BrokerAdmin, Target, compare, discover, load_recording, run
from tests.compat.common import split_allowed
from tests.workers.inprocess import InProcessWorkers, in_process_workers

SCENARIOS = discover()
CLIENTS = 1  # the worker the scenarios' clients connect to


class _WriterAdmin:
    """The scenarios' administrative calls, made on worker 0 (the metadata writer),
    returning once every worker has them."""

    def __init__(self, workers: InProcessWorkers) -> None:
        self.workers = workers

    def __getattr__(self, name: str) -> Any:
        def operation(*args: Any, **kwargs: Any) -> Any:
            w = self.workers
            admin = w.nodes[0].broker.admin
            result = w.call(lambda: getattr(admin, name)(*args, **kwargs))
            w.run(w.nodes[0].broker.meta.settled())
            return result

        return operation


class _Broker:
    def __init__(self, workers: InProcessWorkers) -> None:
        self.admin = _WriterAdmin(workers)


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    # worker 0 runs the management API, as in `leveret server --workers N`: the
    # scenarios that declare through it (`s.http`) reach the writer that way
    with in_process_workers(2, per_worker={0: {"management_port": 0}}) as w:
        for mesh in w.meshes:
            mesh.owner_of = lambda vhost, name: CLIENTS  # type: ignore[method-assign]
        management = f"http://127.0.0.1:{w.nodes[0].management.port}"  # type: ignore[union-attr]
        yield Target("127.0.0.1", w.port(CLIENTS), BrokerAdmin(_Broker(w)), management=management)


@pytest.mark.parametrize("sid", list(SCENARIOS))
def test_scenario_matches_rabbitmq_through_the_writer(target: Target, sid: str) -> None:
    sc = SCENARIOS[sid]
    expected = load_recording(sc)
    assert expected is not None, f"{sid} is not recorded: run tests.compat.amqp.record"
    actual = run(target, sc, expected)
    assert "error" not in actual, actual["error"]
    left, _used = split_allowed(compare(sid, expected, actual), ALLOWED)
    assert left == [], "\n".join(map(str, left))


def _model(w: InProcessWorkers, index: int) -> dict[str, Any]:
    """What a worker holds of the metadata, comparable between workers (password hashes
    are salted on each worker)."""

    def read() -> dict[str, Any]:
        snapshot = w.nodes[index].broker.meta.snapshot()
        snapshot.pop("seq")
        for user in snapshot["admin"]["users"]:
            user.pop("password_hash", None)
        for vhost in snapshot["vhosts"].values():
            for kind in ("queues", "exchanges", "bindings"):
                vhost[kind] = sorted(map(repr, vhost[kind]))
        return snapshot

    return w.call(read)


def test_management_api_table_through_the_writer(tmp_path: Path) -> None:
    """The management API's recorded table (tests/compat/http) against worker 0 of two:
    no difference the one-process replay does not have but the `worker` field of
    queues and connections, and worker 1 ends with the same metadata as worker 0."""
    from tests.compat.http.allowed import ALLOWED as HTTP_ALLOWED
    from tests.compat.http.replay import gap_key, known_gaps, replay
    from tests.compat.http.runner import Target as HttpTarget

    with in_process_workers(2, tmp_path, management_port=0, prometheus_port=0) as w:
        for mesh in w.meshes:  # the API and its AMQP clients are on worker 0
            mesh.owner_of = lambda vhost, name: 0  # type: ignore[method-assign]
        target = HttpTarget(f"http://127.0.0.1:{w.nodes[0].management.port}", w.url(0))
        expected, diffs = replay(target)
        assert expected, "no recordings"
        left, _used = split_allowed(diffs, HTTP_ALLOWED)
        gaps = known_gaps()
        # (a broker of several workers names each queue's and connection's worker: the
        # `worker` field of their listings)
        new = [
            str(d)
            for d in left
            if gap_key(d) not in gaps and not (d.kind == "extra" and d.path.endswith("worker"))
        ]
        assert not new, "differences from RabbitMQ 3.10.8:\n" + "\n".join(new[:50])
        w.run(w.nodes[0].broker.meta.settled())
        assert _model(w, 1) == _model(w, 0)
