"""The tail-offsets extension: a stream's first and next offsets over AMQP 0-9-1.

A Spark driver must learn where each partition starts and ends without
consuming.  RabbitMQ offers that only through its stream protocol, so Leveret
answers a request published on the default exchange with the routing key
`amq.leveret.stream-offsets`:

    request body (JSON): {"streams": ["s1", ...]} or {"super_stream": "name"},
                         optionally "timestamp": ms since the epoch
    reply (to reply_to, same correlation_id, content_type application/json):
        {"partitions": [{"stream", "first", "next", "first_timestamp",
                         "last_timestamp", "offset_for_timestamp"}, ...]}
        or {"error": "not_found" | "bad_request", "reason": "..."}

It cannot be confused with RabbitMQ's behaviour: names starting `amq.` cannot be
declared there, so RabbitMQ returns such a mandatory publish with 312 NO_ROUTE.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.queues.stream import StreamQueue

if TYPE_CHECKING:
    from leveret.broker.vhost import VirtualHost

ROUTING_KEY = "amq.leveret.stream-offsets"


def _error(kind: str, reason: str) -> dict[str, Any]:
    return {"error": kind, "reason": reason}


def super_stream_partitions(vhost: VirtualHost, name: str) -> list[str] | None:
    """A super stream's partitions in x-stream-partition-order, or None."""
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        return None
    found = []
    for binding in exchange.bindings.values():
        dest = binding.destination
        if isinstance(dest, StreamQueue):
            order = binding.arguments.get("x-stream-partition-order", len(found))
            found.append((order, dest.name))
    return [n for _, n in sorted(found)]


def when_readable(vhost: VirtualHost, body: bytes, then: Callable[[], None]) -> None:
    """Call `then` once the records the asked streams hold now are readable.

    At once on a single node. On a cluster leader a stream's `next` is what the
    followers hold (StreamLog.readable_end), which lags the log by a replication
    round trip, and by the followers' catching up just after an election: waiting
    makes the answer count every record published before the request.
    """
    try:
        request = json.loads(body)
        if "super_stream" in request:
            names = super_stream_partitions(vhost, request["super_stream"]) or []
        else:
            names = [n for n in request.get("streams") or [] if isinstance(n, str)]
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError):
        names = []
    logs = []
    for name in names:
        queue = vhost.queues.get(name)
        if isinstance(queue, StreamQueue) and queue.log.readable_end() < queue.log.next:
            logs.append(queue.log)
    if not logs:
        then()
        return
    left = len(logs)

    def one(_error: BaseException | None) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            then()  # an error (a failed fsync) answers with what is readable

    for log in logs:
        log.when_durable(one)


def answer(vhost: VirtualHost, body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _error("bad_request", f"the body is not JSON: {exc}")
    if not isinstance(request, dict):
        return _error("bad_request", "the body must be a JSON object")
    timestamp = request.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)):
        return _error("bad_request", "timestamp must be an integer (ms since the epoch)")
    if "super_stream" in request:
        name = request["super_stream"]
        if not isinstance(name, str):
            return _error("bad_request", "super_stream must be a string")
        names = super_stream_partitions(vhost, name)
        if not names:
            return _error("not_found", f"no super stream '{name}' in vhost '{vhost.name}'")
    elif "streams" in request:
        names = request["streams"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return _error("bad_request", "streams must be a list of stream names")
    else:
        return _error("bad_request", 'the request needs "streams" or "super_stream"')
    partitions = []
    for name in names:
        queue = vhost.queues.get(name)
        if not isinstance(queue, StreamQueue):
            return _error("not_found", f"no stream '{name}' in vhost '{vhost.name}'")
        log = queue.log
        # `next`, but on a cluster leader what its followers hold (readable_end)
        end = max(log.readable_end(), log.first)
        partitions.append(
            {
                "stream": name,
                "first": log.first,
                "next": end,
                "first_timestamp": log.first_timestamp,
                "last_timestamp": log.last_timestamp,
                "offset_for_timestamp": (
                    min(log.offset_for_timestamp(timestamp), end) if timestamp is not None else None
                ),
            }
        )
    return {"partitions": partitions}
