"""A subscription of one channel to one queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from leveret.protocol.methods import deliver_prefix

if TYPE_CHECKING:
    from leveret.broker.ports import DeliveryChannel
    from leveret.broker.queues import Queue


class Consumer:
    __slots__ = (
        "tag",
        "channel",
        "queue",
        "no_ack",
        "exclusive",
        "prefetch",
        "priority",
        "unacked",
        "arguments",
        "ctag_prefix",
        "active",
    )

    def __init__(
        self,
        tag: str,
        channel: DeliveryChannel,
        queue: Queue,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        priority: int = 0,
        arguments: dict | None = None,
    ) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # 0 = unlimited (per-consumer limit, basic.qos global=false)
        self.priority = priority
        self.unacked = 0
        self.arguments = arguments or {}
        self.ctag_prefix = deliver_prefix(tag)  # encoded once, reused per delivery
        # False while single-active-consumer keeps this one waiting.
        self.active = True

    def can_take(self) -> bool:
        """Whether one more delivery fits this consumer's and its channel's limits."""
        channel = self.channel
        if not channel.deliverable:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        limit = channel.global_prefetch
        # credit_out: deliveries other workers may still send under the same window
        return not (limit and channel.unacked_count + channel.credit_out >= limit)
