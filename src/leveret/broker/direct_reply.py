"""Direct reply-to (RabbitMQ's `amq.rabbitmq.reply-to`): RPC replies without a queue.

A client consumes the pseudo-queue `amq.rabbitmq.reply-to` in no-ack mode; its
requests carry `reply_to: amq.rabbitmq.reply-to`, which the broker rewrites to
`amq.rabbitmq.reply-to.<token>`. A reply published to the default exchange
with that routing key goes straight to the waiting channel, or is dropped if
the channel has gone (as in RabbitMQ).
"""

from __future__ import annotations

import base64
import os
from typing import Any

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = PSEUDO_QUEUE + "."


def new_token() -> str:
    """The random part of a reply-to name."""
    return base64.urlsafe_b64encode(os.urandom(18)).decode()


class DirectReplyRegistry:
    def __init__(self) -> None:
        self._by_token: dict[str, Any] = {}

    def register(self, channel: Any) -> str:
        token = new_token()
        self._by_token[token] = channel
        return token

    def unregister(self, token: str) -> None:
        self._by_token.pop(token, None)

    def lookup(self, routing_key: str) -> Any:
        """The channel waiting for replies addressed to this routing key, if any."""
        return self._by_token.get(routing_key[len(PREFIX) :])
