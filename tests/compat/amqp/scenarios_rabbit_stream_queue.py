"""RabbitMQ's deps/rabbit/test/rabbit_stream_queue_SUITE (v3.10.8), translated in part.

The suite's `all_tests()` run on one node (`single_node_parallel`), each a scenario of
the same name; every reply and delivery is recorded. Publishes wait for their confirm
one at a time, so that each message is a chunk of its own on RabbitMQ and deliveries
per credit are the same on every run.

Left out: the cluster groups (replicas, leader failover, coordinator); the tests that
read the queue's state by Erlang RPC (`consume_from_last`'s committed offset,
`invalid_policy`, `queue_info`, `tracking_status`, `update_retention_policy`), wait
for retention to apply (`max_length_bytes`, `max_age`, `max_age_policy`,
`max_segment_size_bytes_policy*`), restart the node (`keep_consuming_on_leader_restart`)
or run property-based loops (`consume_offset`).
"""

from __future__ import annotations

import datetime as dt

from .runner import C, Conn, Session, scenario

STREAM = {"x-queue-type": "stream"}
MAX_SEGMENT = 3_000_000_000  # RabbitMQ 3.10's ?MAX_STREAM_MAX_SEGMENT_SIZE


def _start(s: Session) -> Conn:
    c = s.connect()
    c.open(1)
    return c


def _declare(c: Conn, ch: int, q: str, **args) -> dict:
    return c.rpc(ch, C.Queue.Declare(queue=q, durable=True, arguments={**STREAM, **args}))


def _publish_confirm(c: Conn, q: str, bodies: list[str], ch: int = 1) -> None:
    if ch not in c.confirm_seq:
        c.confirm_select(ch)
    for body in bodies:
        c.publish(ch, "", q, body)
        c.confirms(ch)


def _subscribe(c: Conn, ch: int, q: str, offset=0, no_ack=False, tag="ctag", prefetch=10):
    c.rpc(ch, C.Basic.Qos(prefetch_count=prefetch))
    args = {} if offset is None else {"x-stream-offset": offset}
    return c.consume(ch, q, tag=tag, no_ack=no_ack, arguments=args)


@scenario
def declare_args(s: Session) -> None:
    """A stream with x-max-length-bytes."""
    c = _start(s)
    _declare(c, 1, "declare_args", **{"x-max-length-bytes": 2_000_000})


@scenario
def declare_max_age(s: Session) -> None:
    """x-max-age 1A is refused, 1Y accepted."""
    c = _start(s)
    c.open(2)
    _declare(c, 2, "declare_max_age", **{"x-max-age": "1A"})
    _declare(c, 1, "declare_max_age", **{"x-max-age": "1Y"})


@scenario
def declare_invalid_properties(s: Session) -> None:
    """auto-delete, exclusive and non-durable streams are refused."""
    c = _start(s)
    for ch, flags in (
        (2, {"auto_delete": True, "durable": True}),
        (3, {"exclusive": True, "durable": True}),
        (4, {"durable": False}),
    ):
        c.open(ch)
        c.rpc(ch, C.Queue.Declare(queue="declare_invalid_properties", arguments=STREAM, **flags))


@scenario
def declare_server_named(s: Session) -> None:
    """A server-named stream is refused."""
    c = _start(s)
    _declare(c, 1, "")


@scenario
def declare_invalid_arg(s: Session) -> None:
    """x-overflow is refused for a stream, with RabbitMQ's text."""
    c = _start(s)
    _declare(c, 1, "declare_invalid_arg", **{"x-overflow": "reject-publish"})


@scenario
def consume_invalid_arg(s: Session) -> None:
    """x-priority on a stream consumer is refused."""
    c = _start(s)
    _declare(c, 1, "consume_invalid_arg")
    c.rpc(1, C.Basic.Qos(prefetch_count=10))
    c.consume(1, "consume_invalid_arg", tag="ctag", arguments={"x-priority": 10})


@scenario
def declare_queue(s: Session) -> None:
    """Declaring a stream twice, then as a classic queue."""
    c = _start(s)
    _declare(c, 1, "declare_queue")
    _declare(c, 1, "declare_queue")
    c.rpc(1, C.Queue.Declare(queue="declare_queue", durable=True))


@scenario
def delete_queue(s: Session) -> None:
    """queue.delete of a stream."""
    c = _start(s)
    _declare(c, 1, "delete_queue")
    c.rpc(1, C.Queue.Delete(queue="delete_queue"))


@scenario
def publish_confirm(s: Session) -> None:
    """A confirmed publish to a stream."""
    c = _start(s)
    _declare(c, 1, "publish_confirm")
    _publish_confirm(c, "publish_confirm", ["msg"])


@scenario
def consume_without_qos(s: Session) -> None:
    """Consuming from a stream without a prefetch is refused."""
    c = _start(s)
    _declare(c, 1, "consume_without_qos")
    c.consume(1, "consume_without_qos", tag="ctag")


@scenario
def consume(s: Session) -> None:
    """Consume from offset 0, ack, cancel, close."""
    c = _start(s)
    q = "consume"
    _declare(c, 1, q)
    _publish_confirm(c, q, ["msg"])
    c.open(2)
    _subscribe(c, 2, q)
    got = c.deliveries(2, 1)
    if got and "delivery_tag" in got[0]:
        c.ack(2, got[0]["delivery_tag"])
    c.rpc(2, C.Basic.Cancel(consumer_tag="ctag"))
    c.close_channel(2)


@scenario
def consume_timestamp_offset(s: Session) -> None:
    """x-stream-offset as a timestamp a minute ago: everything."""
    c = _start(s)
    q = "consume_timestamp_offset"
    _declare(c, 1, q)
    _publish_confirm(c, q, ["111"] * 20)
    c.open(2)
    past = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=60)
    _subscribe(c, 2, q, offset=past)
    c.deliveries(2, 10)


@scenario
def consume_timestamp_last_offset(s: Session) -> None:
    """x-stream-offset as a timestamp a minute ahead: only what comes next."""
    c = _start(s)
    q = "consume_timestamp_last_offset"
    _declare(c, 1, q)
    _publish_confirm(c, q, ["111"] * 20)
    c.open(2)
    future = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=60)
    _subscribe(c, 2, q, offset=future)
    c.events(2)
    _publish_confirm(c, q, ["msg2"] * 5)
    c.deliveries(2, 5)


@scenario
def basic_get(s: Session) -> None:
    """basic.get from a stream: 540 closes the connection."""
    c = _start(s)
    _declare(c, 1, "basic_get")
    c.get(1, "basic_get", no_ack=False)


@scenario
def consume_with_autoack(s: Session) -> None:
    """A no-ack consumer on a stream: 540."""
    c = _start(s)
    _declare(c, 1, "consume_with_autoack")
    c.open(2)
    _subscribe(c, 2, "consume_with_autoack", no_ack=True)


def _settle_then_declare(s: Session, name: str, how: str) -> None:
    c = _start(s)
    _declare(c, 1, name)
    _publish_confirm(c, name, ["msg"])
    c.open(2)
    _subscribe(c, 2, name)
    got = c.deliveries(2, 1)
    tag = got[0].get("delivery_tag", 1) if got else 1
    if how == "nack":
        c.nack(2, tag, requeue=True)
    elif how == "reject":
        c.reject(2, tag, requeue=True)
    else:
        c.ack(2, tag)
    _declare(c, 2, name)


@scenario
def consume_and_nack(s: Session) -> None:
    """A nack with requeue on a stream: 540 on the next call."""
    _settle_then_declare(s, "consume_and_nack", "nack")


@scenario
def consume_and_ack(s: Session) -> None:
    """An ack on a stream, then a declare on the same channel."""
    _settle_then_declare(s, "consume_and_ack", "ack")


@scenario
def consume_and_reject(s: Session) -> None:
    """A reject with requeue on a stream: 540 on the next call."""
    _settle_then_declare(s, "consume_and_reject", "reject")


def _from_next(s: Session, name: str, offset) -> None:
    c = _start(s)
    _declare(c, 1, name)
    _publish_confirm(c, name, ["msg1"] * 10)
    c.open(2)
    _subscribe(c, 2, name, offset=offset)
    c.events(2)
    _publish_confirm(c, name, ["msg2"] * 5)
    c.deliveries(2, 5)


@scenario
def consume_from_next(s: Session) -> None:
    """x-stream-offset next: only what is published after the consume."""
    _from_next(s, "consume_from_next", "next")


@scenario
def consume_from_default(s: Session) -> None:
    """No x-stream-offset: as next."""
    _from_next(s, "consume_from_default", None)


@scenario
def consume_from_relative_time_offset(s: Session) -> None:
    """x-stream-offset 100s: what the last 100 seconds published."""
    c = _start(s)
    q = "consume_from_relative_time_offset"
    _declare(c, 1, q)
    _publish_confirm(c, q, ["msg1"] * 10)
    c.open(2)
    _subscribe(c, 2, q, offset="100s")
    c.deliveries(2, 10)


def _credit(s: Session, name: str, how: str) -> None:
    c = _start(s)
    _declare(c, 1, name)
    _publish_confirm(c, name, ["msg1"] * 10)
    c.open(2)
    _subscribe(c, 2, name, prefetch=2)
    got = [d for d in c.deliveries(2, 2) if "delivery_tag" in d]
    c.events(2)
    tags = [d["delivery_tag"] for d in got]
    if how == "multiple" and tags:
        c.ack(2, tags[-1], multiple=True)
        c.deliveries(2, 2)
        return
    if how == "out_of_order":
        tags.reverse()
    if tags:
        c.ack(2, tags[0])
        c.deliveries(2, 1)


@scenario
def consume_credit(s: Session) -> None:
    """Prefetch 2: two deliveries, then one more per ack."""
    _credit(s, "consume_credit", "in_order")


@scenario
def consume_credit_out_of_order_ack(s: Session) -> None:
    """Prefetch 2, the later delivery acked first: one more delivery."""
    _credit(s, "consume_credit_out_of_order_ack", "out_of_order")


@scenario
def consume_credit_multiple_ack(s: Session) -> None:
    """Prefetch 2, a multiple ack of both: two more deliveries."""
    _credit(s, "consume_credit_multiple_ack", "multiple")


@scenario
def basic_cancel(s: Session) -> None:
    """basic.cancel of a stream consumer after a delivery."""
    c = _start(s)
    q = "basic_cancel"
    _declare(c, 1, q)
    _publish_confirm(c, q, ["msg"])
    c.open(2)
    _subscribe(c, 2, q, tag="basic_cancel")
    c.deliveries(2, 1)
    c.rpc(2, C.Basic.Cancel(consumer_tag="basic_cancel"))


@scenario
def receive_basic_cancel_on_queue_deletion(s: Session) -> None:
    """A stream consumer gets basic.cancel when the stream is deleted."""
    c = _start(s)
    q = "receive_basic_cancel_on_queue_deletion"
    _declare(c, 1, q)
    _subscribe(c, 1, q, tag="basic_cancel_notification_on_queue_deletion")
    c.open(2)
    c.rpc(2, C.Queue.Delete(queue=q))
    c.events(1)


@scenario
def max_segment_size_bytes_validation(s: Session) -> None:
    """x-stream-max-segment-size-bytes 10 MB is accepted, past RabbitMQ's maximum not."""
    c = _start(s)
    q = "max_segment_size_bytes_validation"
    _declare(c, 1, q, **{"x-stream-max-segment-size-bytes": 10_000_000})
    _declare(c, 1, q, **{"x-stream-max-segment-size-bytes": MAX_SEGMENT + 1_000})


@scenario
def purge(s: Session) -> None:
    """queue.purge of a stream: 540."""
    c = _start(s)
    _declare(c, 1, "purge")
    c.rpc(1, C.Queue.Purge(queue="purge"))
