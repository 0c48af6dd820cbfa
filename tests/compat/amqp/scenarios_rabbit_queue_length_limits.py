"""RabbitMQ's deps/rabbit/test/queue_length_limits_SUITE (v3.10.8), translated.

Each test of the suite's `max_length_classic` and `max_length_quorum` groups is a
scenario of the same name with the group as prefix, doing the same publishes, gets,
confirms and nacks; what the Erlang test asserted is recorded from RabbitMQ instead
(every reply, every confirm). Left out: `max_length_mirrored`, the same tests on a
classic queue mirrored over a three-node cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from .runner import C, Conn, Session, scenario

#: (group prefix, queue arguments, durable) for the suite's groups
GROUPS = {
    "classic": ({"x-queue-type": "classic"}, False),
    "quorum": ({"x-queue-type": "quorum"}, True),
}
BYTES = ["1" * 80, "2" * 80, "3" * 80]
SMALL = ["1", "2", "3"]


def _declare(c: Conn, group: str, q: str, **args) -> None:
    qargs, durable = GROUPS[group]
    c.rpc(1, C.Queue.Declare(queue=q, durable=durable, arguments={**args, **qargs}))


def _publish(c: Conn, q: str, *bodies: str) -> None:
    for body in bodies:
        c.publish(1, "", q, body)
    c.confirms(1)


def _one_stays(c: Conn, q: str, p1: str, p2: str, p3: str) -> None:
    """The suite's check_max_length_drops_head and check_max_length_drops_publish: the
    same publishes and gets (which message stays is what differs, and is recorded)."""
    if 1 not in c.confirm_seq:
        c.confirm_select(1)
    c.get(1, q)
    _publish(c, q, p1)
    c.get(1, q)
    c.get(1, q)
    _publish(c, q, p1, p2)
    c.get(1, q)
    c.get(1, q)
    _publish(c, q, p1, p2, p3)
    c.get(1, q)
    c.get(1, q)


def _rejects(c: Conn, q: str, p1: str, p2: str, p3: str) -> None:
    c.get(1, q)
    _publish(c, q, p1)
    _publish(c, q, p2)
    _publish(c, q, p3)
    c.get(1, q)
    _publish(c, q, p2)
    c.get(1, q)


def _requeue(c: Conn, q: str, p1: str, p2: str) -> None:
    c.confirm_select(1)
    c.get(1, q)
    _publish(c, q, p1)
    c.get(1, q, no_ack=False)
    c.get(1, q)
    _publish(c, q, p2)
    c.nack(1, 1, requeue=True)
    c.get(1, q)
    c.get(1, q)
    c.get(1, q)


def _test(group: str, name: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.connect()
        c.open(1)
        q = f"{group}_{name}"
        reject = {"x-overflow": "reject-publish"}
        if name in ("max_length_default", "max_length_drop_head"):
            extra = {"x-overflow": "drop-head"} if name.endswith("drop_head") else {}
            _declare(c, group, q, **{"x-max-length": 1}, **extra)
            _one_stays(c, q, *SMALL)
        elif name in ("max_length_bytes_default", "max_length_bytes_drop_head"):
            extra = {"x-overflow": "drop-head"} if name.endswith("drop_head") else {}
            _declare(c, group, q, **{"x-max-length-bytes": 100}, **extra)
            _one_stays(c, q, *BYTES)
        elif name == "max_length_reject_confirm":
            _declare(c, group, q, **{"x-max-length": 1}, **reject)
            c.confirm_select(1)
            _one_stays(c, q, *SMALL)
            _rejects(c, q, *SMALL)
        elif name == "max_length_bytes_reject_confirm":
            _declare(c, group, q, **{"x-max-length-bytes": 100}, **reject)
            c.confirm_select(1)
            _one_stays(c, q, *BYTES)
            _rejects(c, q, *BYTES)
        elif name == "max_length_drop_publish":
            _declare(c, group, q, **{"x-max-length": 1}, **reject)
            _one_stays(c, q, *SMALL)
        elif name == "max_length_drop_publish_requeue":
            _declare(c, group, q, **{"x-max-length": 1}, **reject)
            _requeue(c, q, *SMALL[:2])
        elif name == "max_length_bytes_drop_publish":
            _declare(c, group, q, **{"x-max-length-bytes": 100}, **reject)
            _one_stays(c, q, *BYTES)
        c.rpc(1, C.Queue.Delete(queue=q))

    run.__name__ = f"{group}_{name}"
    run.__doc__ = f"queue_length_limits_SUITE: {name} in the max_length_{group} group"
    return run


CLASSIC_TESTS = (
    "max_length_default",
    "max_length_bytes_default",
    "max_length_drop_head",
    "max_length_bytes_drop_head",
    "max_length_reject_confirm",
    "max_length_bytes_reject_confirm",
    "max_length_drop_publish",
    "max_length_drop_publish_requeue",
    "max_length_bytes_drop_publish",
)
for _name in CLASSIC_TESTS:
    scenario(_test("classic", _name))
for _name in ("max_length_default", "max_length_bytes_default"):
    scenario(_test("quorum", _name))
