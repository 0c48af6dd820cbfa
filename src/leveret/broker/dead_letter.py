"""Dead-lettering: republishing rejected, expired and overflowed messages to a DLX.

The dead-lettered copy gets an `x-death` header written the way RabbitMQ writes
it: one entry per (queue, reason) with a count, newest first; an entry seen
again is counted and moved to the front. `x-first-death-*` is set once and
`x-last-death-*` every time. The `expiration` property is removed and kept as
the entry's `original-expiration`. Cycles with no rejection in them are
dropped, as RabbitMQ drops them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from leveret import wallclock
from leveret.broker.message import Message
from leveret.protocol.fieldtable import (
    Long,
    decode_value,
    encode_value,
    join_array,
    join_table,
    split_array,
    split_table,
)
from leveret.protocol.properties import (
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    REMOVE,
    rewrite_header,
    split_properties,
)

if TYPE_CHECKING:
    from leveret.broker.queues import Queue
    from leveret.broker.vhost import VirtualHost

log = logging.getLogger("leveret.dead_letter")

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def dead_letter_message(message: Message, queue: Queue, reason: str) -> Message:
    """A copy of `message` as the DLX will see it (the original stays untouched).

    Only the headers and expiration change; every other property keeps the
    bytes the publisher sent.
    """
    opts = queue.options
    props = message.properties
    present = split_properties(message.header)
    table = split_table(present[FLAG_HEADERS]) if FLAG_HEADERS in present else {}
    headers = message.headers or {}
    routing_keys = [message.routing_key] + [
        _text(k) for k in (headers.get("CC") or []) if isinstance(k, str | bytes)
    ]
    now = wallclock.now_utc().replace(microsecond=0)
    # RabbitMQ's key order for a new entry.
    entry: dict[str, Any] = {
        "count": Long(1),
        "reason": reason,
        "queue": queue.name,
        "time": now,
        "exchange": message.exchange,
        "routing-keys": routing_keys,
    }
    changes: dict[int, Any] = {}
    if props.expiration is not None:
        entry["original-expiration"] = props.expiration
        changes[FLAG_EXPIRATION] = REMOVE
    elements = split_array(table["x-death"]) if table.get("x-death", b"")[:1] == b"A" else []
    for i, raw in enumerate(elements):
        death = decode_value(raw) if raw[:1] == b"F" else None
        if (
            isinstance(death, dict)
            and _text(death.get("queue")) == queue.name
            and _text(death.get("reason")) == reason
        ):
            death["count"] = Long(int(death.get("count", 0)) + 1)
            death["time"] = now
            del elements[i]
            elements.insert(0, encode_value(death))
            break
    else:
        elements.insert(0, encode_value(entry))
    table["x-death"] = join_array(elements)
    if "x-first-death-reason" not in table:
        table["x-first-death-reason"] = encode_value(reason)
        table["x-first-death-queue"] = encode_value(queue.name)
        table["x-first-death-exchange"] = encode_value(message.exchange)
    table["x-last-death-reason"] = encode_value(reason)
    table["x-last-death-queue"] = encode_value(queue.name)
    table["x-last-death-exchange"] = encode_value(message.exchange)
    changes[FLAG_HEADERS] = join_table(table)
    routing_key = opts.dead_letter_routing_key or message.routing_key
    copy = Message(
        opts.dead_letter_exchange or "", routing_key, b"", message.body, 0, message.persistent
    )
    copy.set_header(rewrite_header(message.header, changes))
    copy.routing_keys = routing_keys if opts.dead_letter_routing_key is None else [routing_key]
    return copy


def _is_cycle(target: str, deaths: list[dict[str, Any]]) -> bool:
    """A fully automatic cycle: target seen before, and no rejection since."""
    for i, death in enumerate(deaths):
        if _text(death.get("queue")) == target:
            return all(_text(d.get("reason")) != REJECTED for d in deaths[: i + 1])
    return False


def count(
    vhost: VirtualHost, queue: Queue, reason: str, n: int = 1, strategy: str | None = None
) -> None:
    """Count messages that left `queue` for `reason` without a delivery, whether or not
    they go anywhere (RabbitMQ's rabbitmq_global_messages_dead_lettered_*_total): with
    strategy "at_most_once" when the queue's DLX exists, "disabled" when they are
    dropped. A queue type with other guarantees (quorum's "at_least_once") passes its own."""
    if strategy is None:
        dlx = queue.options.dead_letter_exchange
        strategy = "at_most_once" if dlx is not None and dlx in vhost.exchanges else "disabled"
    vhost.counters.add_dead_lettered(reason, queue.queue_type, strategy, n)


def dead_letter(vhost: VirtualHost, queue: Queue, message: Message, reason: str) -> None:
    """Send `message`, which left `queue` for `reason`, to the queue's DLX if it has one
    (at most once: whatever the targets do with it)."""
    if queue.options.dead_letter_exchange is None:
        return
    forward(vhost, queue, dead_letter_message(message, queue, reason), reason)


def targets(vhost: VirtualHost, queue: Queue, copy: Message, reason: str) -> list[Queue]:
    """The queues the dead-lettered `copy` goes to: routed from the queue's DLX (none if
    that exchange does not exist), less those that would close an automatic cycle."""
    dlx_name = queue.options.dead_letter_exchange
    exchange = vhost.exchanges.get(dlx_name) if dlx_name is not None else None
    if exchange is None:
        log.debug(
            "dead-letter exchange '%s' of %s does not exist; message dropped",
            dlx_name,
            queue.describe(),
        )
        return []
    found = vhost.route_keys(exchange, copy, copy.routing_keys)  # type: ignore[arg-type]
    if reason != REJECTED:
        deaths = copy.headers.get("x-death") or []  # type: ignore[union-attr]
        kept = [q for q in found if not _is_cycle(q.name, deaths)]
        if len(kept) != len(found):
            log.debug(
                "dead-letter cycle detected for a message from %s; dropped for %d queue(s)",
                queue.describe(),
                len(found) - len(kept),
            )
        found = kept
    return found


def forward(
    vhost: VirtualHost, queue: Queue, copy: Message, reason: str, skip: Iterable[Queue] = ()
) -> None:
    """Enqueue a dead-lettered copy into its targets (but `skip`)."""
    found = [q for q in targets(vhost, queue, copy, reason) if q not in skip]
    # Several durable targets: the store may write the copy's body once for all.
    shared = len(found) > 1 and vhost.hooks.share_body(copy, found, None)
    try:
        for target in found:
            target.enqueue(copy)
    finally:
        if shared:
            vhost.hooks.share_done()
