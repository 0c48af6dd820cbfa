"""Leveret's tail-offsets extension, asked from the Spark driver.

Why: the driver must know each partition's first and next offset without consuming.
Leveret answers a request published on the default exchange with the routing key
`amq.leveret.stream-offsets`; RabbitMQ has no such queue, so the
mandatory publish comes back NO_ROUTE and we say the broker is not Leveret.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pamqp import commands

from leveret.spark._amqp import AmqpError, Client

OFFSETS_KEY = "amq.leveret.stream-offsets"
REPLY_TO = "amq.rabbitmq.reply-to"


class NotLeveret(AmqpError):
    """The broker does not answer the tail-offsets extension (e.g. it is RabbitMQ)."""


class StreamNotFound(AmqpError):
    """A stream or super stream that the options name does not exist."""


@dataclass(frozen=True)
class PartitionTail:
    stream: str
    first: int  # oldest offset still stored
    next: int  # offset the next published message gets
    first_timestamp: int | None  # ms
    last_timestamp: int | None  # ms
    offset_for_timestamp: int | None  # first offset at or after the asked timestamp


def stream_offsets(
    client: Client,
    streams: list[str] | None = None,
    super_stream: str | None = None,
    timestamp: int | None = None,
) -> list[PartitionTail]:
    """Ask for the tails of `streams` or of every partition of `super_stream`, in order."""
    request: dict = {"super_stream": super_stream} if super_stream else {"streams": streams}
    if timestamp is not None:
        request["timestamp"] = timestamp
    if not client._reply_consumer:
        client.consume(REPLY_TO, no_ack=True)
        client._reply_consumer = True
    correlation = uuid.uuid4().hex
    client.publish(
        "",
        OFFSETS_KEY,
        json.dumps(request).encode(),
        commands.Basic.Properties(
            reply_to=REPLY_TO, correlation_id=correlation, content_type="application/json"
        ),
        mandatory=True,
    )
    client.flush()
    where = client.endpoint.address
    for delivery in client.deliveries_or_returns():
        if delivery is None:  # a basic.return
            raise NotLeveret(
                f"the broker at {where} does not answer Leveret's tail-offsets extension "
                f"(the request to {OFFSETS_KEY!r} came back unroutable): format('leveret') "
                "reads streams from Leveret only"
            )
        if delivery.properties.correlation_id != correlation:
            continue
        reply = json.loads(delivery.body)
        if "error" in reply:
            what = f"super stream {super_stream!r}" if super_stream else f"stream(s) {streams}"
            vhost = client.endpoint.vhost
            if reply["error"] == "not_found":
                raise StreamNotFound(
                    f"{what} not found in vhost {vhost!r} on {where}: {reply.get('reason', '')}"
                )
            raise AmqpError(f"tail offsets of {what} refused by {where}: {reply}")
        return [
            PartitionTail(
                stream=p["stream"],
                first=int(p["first"]),
                next=int(p["next"]),
                first_timestamp=p.get("first_timestamp"),
                last_timestamp=p.get("last_timestamp"),
                offset_for_timestamp=p.get("offset_for_timestamp"),
            )
            for p in reply["partitions"]
        ]
    raise AmqpError(f"no tail-offsets reply from {where}")  # pragma: no cover
