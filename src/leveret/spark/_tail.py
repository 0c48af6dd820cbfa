"""Leveret's tail-offsets extension, asked from the Spark driver.

Why: the driver must know each partition's first and next offset without consuming.
Leveret answers a request published on the default exchange with the routing key
`amq.leveret.stream-offsets`; RabbitMQ has no such queue, so the
mandatory publish comes back NO_ROUTE and we say the broker is not Leveret.
On a cluster, `next` is what the followers hold: the offsets a query plans can be read
on any node that takes over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from leveret.client import ClientError, Connection, MessageReturned, RPCTimeout
from leveret.spark._client import AmqpError, ConnectionLost, where
from leveret.spark.options import ReadOptions

OFFSETS_KEY = "amq.leveret.stream-offsets"


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


async def stream_offsets(
    conn: Connection,
    opts: ReadOptions,
    streams: list[str] | None = None,
    super_stream: str | None = None,
    timestamp: int | None = None,
) -> list[PartitionTail]:
    """Ask for the tails of `streams` or of every partition of `super_stream`, in order."""
    request: dict = {"super_stream": super_stream} if super_stream else {"streams": streams}
    if timestamp is not None:
        request["timestamp"] = timestamp
    address = where(conn.params)
    try:
        channel = await conn.channel()
        reply = await channel.rpc_call(
            json.dumps(request).encode(),
            OFFSETS_KEY,
            timeout=opts.timeout,
            mandatory=True,
            content_type="application/json",
        )
    except MessageReturned:
        raise NotLeveret(
            f"the broker at {address} does not answer Leveret's tail-offsets extension "
            f"(the request to {OFFSETS_KEY!r} came back unroutable): format('leveret') "
            "reads streams from Leveret only"
        ) from None
    except RPCTimeout:
        raise ConnectionLost(
            f"no tail-offsets reply from {address} within {opts.timeout:g} s"
        ) from None
    except ClientError as exc:
        raise ConnectionLost(f"asking {address} for tail offsets: {exc}") from None
    answer = json.loads(reply.body)
    if "error" in answer:
        what = f"super stream {super_stream!r}" if super_stream else f"stream(s) {streams}"
        vhost = conn.params.vhost
        if answer["error"] == "not_found":
            raise StreamNotFound(
                f"{what} not found in vhost {vhost!r} on {address}: {answer.get('reason', '')}"
            )
        raise AmqpError(f"tail offsets of {what} refused by {address}: {answer}")
    return [
        PartitionTail(
            stream=p["stream"],
            first=int(p["first"]),
            next=int(p["next"]),
            first_timestamp=p.get("first_timestamp"),
            last_timestamp=p.get("last_timestamp"),
            offset_for_timestamp=p.get("offset_for_timestamp"),
        )
        for p in answer["partitions"]
    ]
