"""leveret.client: an asyncio (and blocking) AMQP 0-9-1 client that recovers.

    import asyncio
    from leveret.client import connect

    async def main():
        async with await connect("amqp://guest:guest@127.0.0.1:5672/%2F") as conn:
            ch = await conn.channel()
            await ch.publish(b"hello", routing_key="jobs")

It works with any AMQP 0-9-1 broker (Leveret, RabbitMQ). The wire protocol is
leveret.protocol.connection, the same sans-IO core the broker uses. For
threads and scripts without asyncio see leveret.client.blocking.
"""

from leveret.client.channel import Channel, OutgoingMessage
from leveret.client.connection import Connection, connect
from leveret.client.consumer import Consumer
from leveret.client.declared import Exchange, Queue
from leveret.client.errors import (
    AccessRefused,
    AuthenticationError,
    BlockedTimeout,
    BrokerError,
    ChannelClosed,
    ClientError,
    ConnectError,
    ConnectionClosed,
    ConnectionLost,
    ConsumerCancelled,
    InvalidURL,
    MessageNacked,
    MessageReturned,
    MessageStateError,
    NotFound,
    PreconditionFailed,
    PublishError,
    PublishFailed,
    PublishTimeout,
    ResourceLocked,
    RPCTimeout,
    Unconfirmed,
)
from leveret.client.message import Message
from leveret.client.url import ConnectionParameters, parse_url
from leveret.protocol.properties import BasicProperties

__all__ = [
    "AccessRefused",
    "AuthenticationError",
    "BasicProperties",
    "BlockedTimeout",
    "BrokerError",
    "Channel",
    "ChannelClosed",
    "ClientError",
    "ConnectError",
    "Connection",
    "ConnectionClosed",
    "ConnectionLost",
    "ConnectionParameters",
    "Consumer",
    "ConsumerCancelled",
    "Exchange",
    "InvalidURL",
    "Message",
    "MessageNacked",
    "MessageReturned",
    "MessageStateError",
    "NotFound",
    "OutgoingMessage",
    "PreconditionFailed",
    "PublishError",
    "PublishFailed",
    "PublishTimeout",
    "Queue",
    "RPCTimeout",
    "ResourceLocked",
    "Unconfirmed",
    "connect",
    "parse_url",
]
