"""What a connection tells its listeners (and its log) about its own life.

Register with `Connection.add_listener(callback)`; the callback gets one of
these, on the event loop thread, and must not block. Every event is also
logged by the `leveret.client` logger.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientEvent:
    """Base class."""


@dataclass(frozen=True)
class ConnectionLost(ClientEvent):
    """The connection went away; `recovering` says whether the client reconnects."""

    reason: str
    recovering: bool


@dataclass(frozen=True)
class ReconnectFailed(ClientEvent):
    """One reconnect attempt (over every host) failed; the next comes after `delay` s."""

    attempt: int
    error: str
    delay: float


@dataclass(frozen=True)
class Reconnected(ClientEvent):
    host: str
    port: int
    attempt: int


@dataclass(frozen=True)
class QueueRenamed(ClientEvent):
    """A server-named queue was declared again and got a new name."""

    old_name: str
    new_name: str


@dataclass(frozen=True)
class ConsumerRestored(ClientEvent):
    consumer_tag: str
    queue: str
    offset: object = None  # stream consumers: where they resume


@dataclass(frozen=True)
class PublishesRetried(ClientEvent):
    """Publishes whose confirm had not arrived were sent again (same bytes, same message id)."""

    channel: int
    count: int


@dataclass(frozen=True)
class PublishesFailed(ClientEvent):
    """Publishes whose confirm had not arrived were raised to their callers as Unconfirmed."""

    channel: int
    count: int


@dataclass(frozen=True)
class RecoveryError(ClientEvent):
    """One thing could not be restored (the rest was); `what` names it."""

    what: str
    error: str


@dataclass(frozen=True)
class Recovered(ClientEvent):
    """Everything that could be restored is; the connection is usable again."""

    seconds: float
    channels: int
    queues: int
    consumers: int


@dataclass(frozen=True)
class Blocked(ClientEvent):
    """The broker blocked publishing (connection.blocked), e.g. on a memory alarm."""

    reason: str


@dataclass(frozen=True)
class Unblocked(ClientEvent):
    pass


@dataclass(frozen=True)
class ConsumerCancelledByBroker(ClientEvent):
    consumer_tag: str
    queue: str


@dataclass(frozen=True)
class ChannelClosedByBroker(ClientEvent):
    """The broker closed a channel (a channel error); the connection carries on."""

    channel: int
    reply_code: int
    reply_text: str
