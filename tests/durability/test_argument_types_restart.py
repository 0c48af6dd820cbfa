"""A declared object's arguments keep their wire types across a restart.

RabbitMQ's refusal of a redeclaration that leaves an argument out names the type it
was declared with (tests/compat/amqp/scenarios_argtypes.py, recorded from RabbitMQ);
a restart cannot be recorded from RabbitMQ, so these check that Leveret answers the
same steps the same after a restart as before it, and before it as RabbitMQ did.
A binding stored by the format before (pamqp's smallest integer types) is found
after the upgrade by an unbind that sends those types.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from durability_support import Brokers, assert_exit_ok, free_port, management_request, store_dirs
from pamqp import commands as C
from pamqp import encode

from compat.amqp.scenarios_argtypes import QUEUE_CASES, declare_queues, redeclare_queues, typed
from leveret.protocol.fieldtable import Byte, Long, SignedInt
from leveret.store.definitions import decode_arguments
from rawamqp import RawClient

pytestmark = pytest.mark.leveret_only

RECORDING = (
    Path(__file__).resolve().parents[1]
    / "compat/amqp/recordings/argtypes/queue_redeclare_other_integer_type.json"
)
SCENARIO_VHOST = "cx-argtypes.queue_redeclare_other_integer_type"
_OKS = (
    C.Queue.DeclareOk,
    C.Queue.BindOk,
    C.Queue.UnbindOk,
    C.Exchange.DeclareOk,
    C.Exchange.DeleteOk,
)


class Answers:
    """What the scenario helpers need of a connection (`open`, `rpc`), over a raw
    client, keeping each answer: the reply's name, or the close's code and text."""

    def __init__(self, port: int) -> None:
        self.raw = RawClient("127.0.0.1", port, timeout=30)
        self.raw.handshake()
        self.got: list[tuple[str, Any]] = []

    def open(self, ch: int) -> None:
        self.raw.open_channel(ch)

    def rpc(self, ch: int, method: Any) -> None:
        self.raw.send_method(ch, method)
        _ch, reply = self.raw.wait_for(C.Channel.Close, *_OKS, channel=ch)
        if isinstance(reply, C.Channel.Close):
            self.raw.send_method(ch, C.Channel.CloseOk())
            self.got.append(("channel.close", f"{reply.reply_code} {reply.reply_text}"))
        else:
            self.got.append((reply.name, None))

    def close(self) -> None:
        self.raw.close()


def _redeclare_answers(port: int) -> list[tuple[str, Any]]:
    answers = Answers(port)
    answers.open(1)
    redeclare_queues(answers, 1)
    answers.close()
    return answers.got


def _recorded_redeclare_answers() -> list[tuple[str, Any]]:
    """RabbitMQ's answers to redeclare_queues, in vhost '/' rather than the scenario's."""
    steps = json.loads(RECORDING.read_text())["steps"]
    declares = [st for st in steps if st["op"] == "queue.declare"]
    out = []
    # the declarations first, the passive declare last: redeclare_queues' are between
    for st in declares[len(QUEUE_CASES) : -1]:
        reply = st["reply"]
        if reply["method"] == "channel.close":
            text = reply["reply_text"].replace(f"vhost '{SCENARIO_VHOST}'", "vhost '/'")
            out.append(("channel.close", f"{reply['reply_code']} {text}"))
        else:
            out.append(("Queue.DeclareOk", None))
    return out


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def test_redeclare_answers_are_the_same_after_a_restart(brokers):
    broker = brokers.start()
    setup = Answers(broker.port)
    setup.open(1)
    declare_queues(setup, 1)
    setup.close()
    assert setup.got == [("Queue.DeclareOk", None)] * len(QUEUE_CASES)
    before = _redeclare_answers(broker.port)
    assert before == _recorded_redeclare_answers()
    for _name, key, first, _other, _extra in QUEUE_CASES:
        assert any(
            f"'{key}'" in str(text) and f"of type '{first.amqp_type}'" in str(text)
            for _m, text in before
        ), (key, first.amqp_type)
    assert_exit_ok(broker)
    broker.start()
    assert _redeclare_answers(broker.port) == before
    # and after a second restart (the store was read, not rewritten, by the first)
    broker.restart()
    assert _redeclare_answers(broker.port) == before


def _bind_headers(port: int, arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    answers = Answers(port)
    answers.open(1)
    answers.rpc(1, typed(C.Queue.Declare, queue="bq", durable=True))
    answers.rpc(1, typed(C.Exchange.Declare, exchange="hx", exchange_type="headers", durable=True))
    answers.rpc(1, typed(C.Queue.Bind, queue="bq", exchange="hx", arguments=arguments))
    answers.close()
    return answers.got


def _unbind(port: int, arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    answers = Answers(port)
    answers.open(1)
    answers.rpc(1, typed(C.Queue.Unbind, queue="bq", exchange="hx", arguments=arguments))
    answers.close()
    return answers.got


def _delete_if_unused(port: int) -> list[tuple[str, Any]]:
    """The exchange's delete with if-unused: refused while a binding is left."""
    answers = Answers(port)
    answers.open(1)
    answers.rpc(1, typed(C.Exchange.Delete, exchange="hx", if_unused=True))
    answers.close()
    return answers.got


def _binding_rows(data_dir: Path) -> list[list[bytes]]:
    """Each store's stored bindings' arguments."""
    out = []
    for store in store_dirs(data_dir):
        db = sqlite3.connect(store / "definitions.db")
        out.append([bytes(r[0]) for r in db.execute("SELECT arguments FROM bindings")])
        db.close()
    return out


def _as_format_1(data_dir: Path) -> None:
    """Rewrite every store's rows as format 1 wrote them (pamqp's encoder: the smallest
    integer type, keys sorted) and mark the files format 1."""
    for store in store_dirs(data_dir):
        db = sqlite3.connect(store / "definitions.db")
        for table in ("exchanges", "queues", "bindings"):
            for rowid, raw in db.execute(f"SELECT rowid, arguments FROM {table}").fetchall():
                old = encode.field_table(decode_arguments(bytes(raw)))
                db.execute(f"UPDATE {table} SET arguments=? WHERE rowid=?", (old, rowid))
        db.execute("UPDATE meta SET value='1' WHERE key='format_version'")
        db.commit()
        db.close()


def _format_versions(data_dir: Path) -> list[str]:
    out = []
    for store in store_dirs(data_dir):
        db = sqlite3.connect(store / "definitions.db")
        out.append(db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()[0])
        db.close()
    return out


def test_a_binding_kept_in_format_1_is_unbound_with_the_smallest_type(brokers):
    """The binding was made with `n` a signedint; format 1 kept it as a byte (pamqp's
    smallest integer type), and a binding's types are its identity. After the upgrade
    an unbind with the signedint finds nothing (the stored binding stays: the exchange
    is still used after another restart); one with the byte, the type the row holds,
    removes it from the store too."""
    arguments = {"x-match": "any", "n": SignedInt(7)}
    broker = brokers.start()
    assert _bind_headers(broker.port, arguments)[-1] == ("Queue.BindOk", None)
    assert_exit_ok(broker)
    _as_format_1(broker.data_dir)
    rows = _binding_rows(broker.data_dir)
    assert rows and all(r == [encode.field_table({"n": 7, "x-match": "any"})] for r in rows), rows
    assert type(decode_arguments(rows[0][0])["n"]) is Byte  # what format 1 kept
    broker.start()
    assert set(_format_versions(broker.data_dir)) == {"2"}
    assert _unbind(broker.port, arguments) == [("Queue.UnbindOk", None)]
    assert_exit_ok(broker)
    assert _binding_rows(broker.data_dir) == rows
    broker.start()
    assert _delete_if_unused(broker.port) != [("Exchange.DeleteOk", None)]
    smallest = {"x-match": "any", "n": Byte(7)}
    assert _unbind(broker.port, smallest) == [("Queue.UnbindOk", None)]
    assert_exit_ok(broker)
    assert _binding_rows(broker.data_dir) == [[] for _ in rows]
    broker.start()
    assert _delete_if_unused(broker.port) == [("Exchange.DeleteOk", None)]


def test_an_unbind_answers_the_same_after_a_restart(brokers, tmp_path):
    """Bound with `n` a long, unbound with it as a signedint, then the exchange's
    delete with if-unused: with a restart after the bind, the answers and what is
    stored are those of a broker that did not restart."""
    bound = {"x-match": "all", "n": Long(7)}
    unbound = {"x-match": "all", "n": SignedInt(7)}
    results = []
    for restart in (False, True):
        broker = brokers.start(tmp_path / f"restart-{restart}")
        got = _bind_headers(broker.port, bound)
        if restart:
            broker.restart()
        got += _unbind(broker.port, unbound)
        rows = _binding_rows(broker.data_dir)
        got += _delete_if_unused(broker.port)
        assert_exit_ok(broker)
        results.append((got, rows))
    assert results[1] == results[0]


def test_the_management_api_shows_the_same_arguments_after_a_restart(brokers):
    """A double stays a double (pamqp's encoder wrote a float as 32 bits: 0.1 came back
    as 0.10000000149011612), a byte array and a nested table as they were sent."""
    mport = free_port()
    broker = brokers.start(extra=("--management-port", str(mport)))
    broker.management = f"http://127.0.0.1:{mport}"
    arguments = {
        "x-max-length": SignedInt(10),
        "x-double": 0.1,
        "x-bytes": bytearray(b"\x00\xff"),
        "x-table": {"b": Long(2), "a": [Byte(1), "s", 2.5]},
    }
    answers = Answers(broker.port)
    answers.open(1)
    answers.rpc(1, typed(C.Queue.Declare, queue="mq", durable=True, arguments=arguments))
    answers.rpc(
        1,
        typed(C.Exchange.Declare, exchange="mx", exchange_type="topic", durable=True,
              arguments=arguments),
    )  # fmt: skip
    answers.close()
    assert answers.got == [("Queue.DeclareOk", None), ("Exchange.DeclareOk", None)]

    def shown() -> tuple[Any, Any]:
        _s, queue = management_request(broker, "GET", "queues/%2F/mq")
        _s, exchange = management_request(broker, "GET", "exchanges/%2F/mx")
        return queue["arguments"], exchange["arguments"]

    before = shown()
    assert before[0]["x-double"] == 0.1 and before[0]["x-table"]["a"] == [1, "s", 2.5]
    broker.restart()
    assert shown() == before


def _headers_bindings(broker: Any) -> list[dict[str, Any]]:
    return management_request(broker, "GET", "bindings/%2F/e/hx/q/bq")[1]


def test_a_management_api_binding_is_a_long_one_across_a_restart(brokers):
    """RabbitMQ 3.10.8 gives a JSON integer in a binding's arguments the type long: an
    unbind with it as a signedint or a byte leaves the binding, one with a long removes
    it. Bindings that differ only in an integer's type have their own properties_key,
    and a DELETE by it removes that one only. A restart keeps the types."""
    mport = free_port()
    broker = brokers.start(extra=("--management-port", str(mport)))
    broker.management = f"http://127.0.0.1:{mport}"
    assert _bind_headers(broker.port, {"x-match": "any", "n": SignedInt(7)})[-1] == (
        "Queue.BindOk",
        None,
    )
    status, _ = management_request(
        broker, "POST", "bindings/%2F/e/hx/q/bq", {"arguments": {"x-match": "any", "n": 7}}
    )
    assert status == 201
    listed = _headers_bindings(broker)
    assert [b["arguments"] for b in listed] == [{"x-match": "any", "n": 7}] * 2
    assert len({b["properties_key"] for b in listed}) == 2
    broker.restart()
    assert _headers_bindings(broker) == listed
    for kind in (SignedInt, Byte):
        _unbind(broker.port, {"x-match": "any", "n": kind(7)})
    assert len(_headers_bindings(broker)) == 1  # the signedint one is gone, not the long
    assert _unbind(broker.port, {"x-match": "any", "n": Long(7)}) == [("Queue.UnbindOk", None)]
    assert _headers_bindings(broker) == []

    # Two bindings made over AMQP: a DELETE by one's properties_key leaves the other.
    for kind in (SignedInt, Long):
        _bind_headers(broker.port, {"x-match": "any", "n": kind(7)})
    first, second = _headers_bindings(broker)
    status, _ = management_request(
        broker, "DELETE", f"bindings/%2F/e/hx/q/bq/{first['properties_key']}"
    )
    assert status == 204
    assert _headers_bindings(broker) == [second]
    broker.restart()
    assert _headers_bindings(broker) == [second]


def test_an_imported_binding_is_a_long_one(brokers):
    """Definitions give a binding's JSON integers RabbitMQ's type, long, as the
    management API does: only an unbind with a long removes the imported binding."""
    mport = free_port()
    broker = brokers.start(extra=("--management-port", str(mport)))
    broker.management = f"http://127.0.0.1:{mport}"
    assert _bind_headers(broker.port, {"x-match": "any", "n": SignedInt(7)})[-1] == (
        "Queue.BindOk",
        None,
    )
    binding = {
        "source": "hx",
        "vhost": "/",
        "destination": "bq",
        "destination_type": "queue",
        "routing_key": "",
        "arguments": {"x-match": "any", "n": 7},
    }
    status, _ = management_request(broker, "POST", "definitions", {"bindings": [binding]})
    assert status in (200, 201, 204)
    assert len(_headers_bindings(broker)) == 2  # the signedint one and the imported long
    broker.restart()
    _unbind(broker.port, {"x-match": "any", "n": SignedInt(7)})
    assert [b["arguments"] for b in _headers_bindings(broker)] == [{"x-match": "any", "n": 7}]
    assert _unbind(broker.port, {"x-match": "any", "n": Long(7)}) == [("Queue.UnbindOk", None)]
    assert _headers_bindings(broker) == []


def test_json_integers_stay_longs_after_a_restart(brokers):
    """A queue declared through the management API and one from a definitions import
    hold a JSON integer as a long, as RabbitMQ does (recorded: argtypes.
    http_declared_integer_arguments, argtypes.definitions_import_integer_arguments):
    a redeclaration without it is told "of type 'long'", before a restart and after."""
    mport = free_port()
    broker = brokers.start(extra=("--management-port", str(mport)))
    broker.management = f"http://127.0.0.1:{mport}"
    arguments = {"x-max-length": 10}
    management_request(broker, "PUT", "queues/%2F/hq", {"durable": True, "arguments": arguments})
    queue = {"name": "dq", "vhost": "/", "durable": True, "auto_delete": False}
    management_request(
        broker, "POST", "definitions", {"queues": [{**queue, "arguments": arguments}]}
    )

    def refusals() -> list[tuple[str, Any]]:
        answers = Answers(broker.port)
        for ch, name in enumerate(("hq", "dq"), 1):
            answers.open(ch)
            answers.rpc(ch, typed(C.Queue.Declare, queue=name, durable=True))
        answers.close()
        return answers.got

    expected = [
        (
            "channel.close",
            f"406 PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' in "
            "vhost '/': received none but current is the value '10' of type 'long'",
        )
        for name in ("hq", "dq")
    ]
    assert refusals() == expected
    broker.restart()
    assert refusals() == expected
