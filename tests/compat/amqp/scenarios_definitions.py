"""Definitions imports that RabbitMQ 3.10 takes while leaving something out, or
refuses: a queue or exchange that exists keeps what it has, a binding with a missing
source or destination is skipped, a refused declaration answers with the AMQP error's
reason. Here (and not only in tests/compat/http, definitions.import.*) so that CI
replays them against a broker of workers too, whose imports go through worker 0
(workers/metadata.py `import_item`); AMQP then sees what the import left.
"""

from __future__ import annotations

from typing import Any

from .runner import C, Session, scenario

#: what the management API shows of a queue or exchange (no statistics)
COLUMNS = "?columns=name,type,durable,auto_delete,arguments"


def queue(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "durable": True, "auto_delete": False, "arguments": arguments}


def exchange(name: str, kind: str, durable: bool = True) -> dict[str, Any]:
    flags = {"auto_delete": False, "internal": False, "arguments": {}}
    return {"name": name, "type": kind, "durable": durable, **flags}


def binding(source: str, destination: str, kind: str = "queue") -> dict[str, Any]:
    return {
        "source": source,
        "destination": destination,
        "destination_type": kind,
        "routing_key": "k",
        "arguments": {},
    }


@scenario
def existing_objects_are_kept(s: Session) -> None:
    """A queue or exchange imported again with other arguments, flags, type, or with a
    bad argument or unknown type: 204, and it keeps what it had (AMQP's redeclaration
    with the file's arguments is refused, naming the kept value)."""
    made = {
        "queues": [queue("dq", **{"x-max-length": 10})],
        "exchanges": [exchange("dx", "direct")],
    }
    s.http("POST", "/api/definitions/{vhost}", made)
    for body in (
        {"queues": [queue("dq", **{"x-max-length": 20})]},
        {"queues": [{**queue("dq"), "durable": False, "auto_delete": True}]},
        {"queues": [queue("dq", **{"x-max-length": "abc"})]},
        {"queues": [queue("dq", **{"x-queue-type": "quorum"})]},
        {"exchanges": [exchange("dx", "topic", durable=False)]},
        {"exchanges": [exchange("dx", "nope")]},
    ):
        s.http("POST", "/api/definitions/{vhost}", body)
    s.http("GET", "/api/queues/{vhost}/dq" + COLUMNS)
    s.http("GET", "/api/exchanges/{vhost}/dx" + COLUMNS)
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="dq", durable=True, arguments={"x-max-length": 20}))


@scenario
def refused_declarations(s: Session) -> None:
    """A bad queue argument or an unknown exchange type: 400 with the AMQP error's
    reason; a queue before the refused one in the same file stays."""
    s.http(
        "POST",
        "/api/definitions/{vhost}",
        {"queues": [queue("dq-good"), queue("dq-bad", **{"x-max-length": "abc"})]},
    )
    s.http("POST", "/api/definitions/{vhost}", {"exchanges": [exchange("dx", "nope")]})
    s.http("GET", "/api/queues/{vhost}/dq-good" + COLUMNS)
    s.http("GET", "/api/queues/{vhost}/dq-bad" + COLUMNS)
    s.http("GET", "/api/exchanges/{vhost}/dx" + COLUMNS)
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="dq-good", passive=True))


@scenario
def bindings_with_a_missing_end(s: Session) -> None:
    """Bindings to a missing queue or exchange, or from a missing exchange: 204 and
    skipped; a binding imported with its queue is made."""
    s.http("POST", "/api/definitions/{vhost}", {"exchanges": [exchange("dx", "direct")]})
    for body in (
        {"bindings": [binding("dx", "zz")]},
        {"bindings": [binding("dx", "dx-nope", "exchange")]},
        {"bindings": [binding("dx-nope", "dq")]},
        {"queues": [queue("dq")], "bindings": [binding("dx", "dq")]},
    ):
        s.http("POST", "/api/definitions/{vhost}", body)
    s.http("GET", "/api/exchanges/{vhost}/dx/bindings/source")
    c = s.connect()
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="zz", passive=True))


@scenario
def missing_vhost_or_user(s: Session) -> None:
    """A queue in a vhost that does not exist, a permission of a user that does not: 400
    with RabbitMQ's `[no_such_vhost, name]`, `[no_such_user, name]`; nothing made."""
    s.http(
        "POST",
        "/api/definitions",
        {"queues": [{**queue("dq"), "vhost": "cx-definitions-nope"}]},
    )
    s.http(
        "POST",
        "/api/definitions",
        {
            "permissions": [
                {
                    "user": "cx-definitions-nobody",
                    "vhost": "/",
                    "configure": ".*",
                    "write": "",
                    "read": "",
                }
            ]
        },
    )
    s.http("GET", "/api/vhosts/cx-definitions-nope")
    s.http("POST", "/api/definitions/{vhost}", [1, 2])
