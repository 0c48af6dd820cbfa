"""Field-table value types across workers: a queue declared through a worker that does
not own it keeps the AMQP type of each argument the client sent, on every worker, in
the owner's refusal texts, in the management API and in the stored definitions,
exactly as a one-process broker keeps them.

Such a declare crosses between workers one of two ways: the connection stays on the
worker that read it and the change goes to worker 0 (`mesh.call(0, "meta", ...)`,
pickled), or the connection moves to the queue's owner (affinity) with the method
encoded again. Both are run here (`affinity`), through raw frames so that every
integer type can be sent (pika writes every int as a signedint, pamqp picks the
smallest type). The texts compared come from the one-process broker, whose answers
the recorded compat cases fix (tests/test_quorum.py::test_bad_argument_values)."""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pamqp import commands

from leveret.broker.queue_args import amqp_type_name
from leveret.broker.queues.remote import RemoteQueue
from leveret.config import ServerConfig
from leveret.protocol.fieldtable import join_table
from leveret.store.definitions import decode_arguments
from leveret.testing import embedded_broker
from rawamqp import RawClient, raw_frame
from workers.inprocess import in_process_workers
from workers.placing import name_on

#: 5 as each integer type of AMQP 0-9-1 field tables
FIVE = {
    "byte": b"b\x05",
    "unsignedbyte": b"B\x05",
    "short": b"s\x00\x05",
    "unsignedshort": b"u\x00\x05",
    "signedint": b"I\x00\x00\x00\x05",
    "unsignedint": b"i\x00\x00\x00\x05",
    "long": b"l" + (5).to_bytes(8, "big"),
}
QUORUM = b"S\x00\x00\x00\x06quorum"
DURABLE = 2  # queue.declare's bits: passive 1, durable 2


def declare(port: int, queue: str, table: dict[str, bytes]) -> tuple[int, str] | None:
    """queue.declare (durable) with the raw typed values `table`; None when declared,
    else the channel.close code and text."""
    name = queue.encode()
    payload = (
        struct.pack(">HHH", 50, 10, 0)
        + bytes((len(name),))
        + name
        + bytes((DURABLE,))
        + join_table(table)
    )
    with RawClient("127.0.0.1", port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(raw_frame(1, 1, payload))
        _, reply = client.wait_for(commands.Queue.DeclareOk, commands.Channel.Close, channel=1)
        if isinstance(reply, commands.Channel.Close):
            client.send_method(1, commands.Channel.CloseOk())
            return reply.reply_code, reply.reply_text
        return None


def refusal(port: int, queue: str) -> tuple[int, str] | None:
    """What a redeclare with no arguments answers (the text names the current type)."""
    return declare(port, queue, {})


def stored_arguments(data_dir: Path, queue: str) -> bytes | None:
    """The arguments of `queue` in the definitions a store dir holds (None: no row)."""
    db = sqlite3.connect(f"file:{data_dir / 'definitions.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT arguments FROM queues WHERE name=?", (queue,)).fetchone()
    finally:
        db.close()
    return None if row is None else bytes(row[0])


def types_of(arguments: dict[str, Any]) -> dict[str, str]:
    return {key: amqp_type_name(value) for key, value in arguments.items()}


def api_arguments(port: int, queue: str) -> dict[str, Any]:
    response = requests.get(
        f"http://127.0.0.1:{port}/api/queues/%2F/{queue}", auth=("guest", "guest"), timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["arguments"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data_dir = tmp_path_factory.mktemp("one")
    config = ServerConfig(port=0, persistence=True, data_dir=str(data_dir), management_port=0)
    with embedded_broker(config) as broker:
        yield broker


@pytest.mark.parametrize("affinity", [False, True], ids=["metadata-call", "affinity"])
def test_argument_types_cross_workers_as_sent(
    one_process: Any, tmp_path: Path, affinity: bool
) -> None:
    with in_process_workers(
        2, tmp_path, per_worker={0: {"management_port": 0}}, affinity=affinity
    ) as w:
        # refused on worker 0 (the owner and the writer), asked through worker 1
        for kind, raw in FIVE.items():
            bad = name_on(w, 0, f"wk-types-bad-{kind}")
            table = {"x-queue-type": QUORUM, "x-dead-letter-strategy": raw}
            expected = (
                406,
                f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue "
                f"'{bad}' in vhost '/': {{unacceptable_type,{kind}}}",
            )
            assert declare(one_process.port, bad, table) == expected
            assert declare(w.port(1), bad, table) == expected
            assert w.call(lambda bad=bad: bad not in w.nodes[0].broker.vhosts["/"].queues)

        for kind, raw in FIVE.items():
            name = name_on(w, 0, f"wk-types-{kind}")
            table = {"x-max-length": raw, "x-foo": raw}
            assert declare(one_process.port, name, table) is None
            assert declare(w.port(1), name, table) is None
            want = {"x-max-length": kind, "x-foo": kind}
            assert (
                one_process.call(
                    lambda name=name: types_of(
                        one_process.server.broker.vhosts["/"].queues[name].arguments
                    )
                )
                == want
            )
            for i in range(2):
                queue = w.call(lambda i=i, name=name: w.nodes[i].broker.vhosts["/"].queues[name])
                assert (type(queue) is RemoteQueue) == (i == 1)
                assert types_of(queue.arguments) == want, f"worker {i}"
                assert list(queue.arguments) == ["x-max-length", "x-foo"]
            # a redeclare without them: the text names the type, on either worker
            text = refusal(one_process.port, name)
            assert text is not None and f"of type '{kind}'" in text[1], text
            assert refusal(w.port(0), name) == text
            assert refusal(w.port(1), name) == text
            # the listing and the stored definition are the one-process broker's
            listed = api_arguments(one_process.server.management.port, name)
            assert listed == {"x-max-length": 5, "x-foo": 5}
            assert api_arguments(w.nodes[0].management.port, name) == listed
            stored = stored_arguments(Path(one_process.config.data_dir), name)
            assert stored is not None and decode_arguments(stored) == {
                "x-max-length": 5,
                "x-foo": 5,
            }
            for i in range(2):  # every worker keeps every definition
                assert stored_arguments(tmp_path / f"worker-{i}", name) == stored, f"worker {i}"
