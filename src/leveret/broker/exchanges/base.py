"""The interface every exchange type implements.

An exchange type only indexes bindings and answers "where does this message
go?". Everything else about an exchange (its name, flags, the list of bindings
for if-unused and persistence) lives in broker.exchange.Exchange.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar


class ExchangeType:
    """Routing logic of one exchange type. Destinations are queues or exchanges."""

    name: ClassVar[str]

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        raise NotImplementedError

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        raise NotImplementedError

    def route(self, routing_key: str, message: Any) -> Iterable[Any]:
        """Every destination the message goes to (duplicates allowed; the caller dedups)."""
        raise NotImplementedError

    @classmethod
    def validate_binding(cls, routing_key: str, arguments: dict[str, Any]) -> None:
        """Raise PreconditionFailed for a binding this type cannot accept."""

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        """Raise PreconditionFailed for exchange.declare arguments this type cannot accept."""

    # basic.publish into an exchange of this type calls check_publish(message) for a
    # message with headers (expiration, reply-to) first, if the type has one: a
    # header the type cannot use is an error for the publisher, not for a later
    # router (dead-lettering, an e2e binding). None: nothing to check (the rule).
    check_publish: Any = None

    def placed(self, vhost: Any, exchange: Any) -> None:
        """The exchange this router serves now exists in `vhost` (a type that routes
        later, the delayed exchange, keeps both)."""

    def recovered(self) -> None:
        """After a restart, the store has given back what this type keeps there."""

    def info(self) -> dict[str, Any]:
        """Type-specific facts the management API shows on the exchange, as a type's
        info/1 in RabbitMQ (the delayed exchange's `messages_delayed`)."""
        return {}

    def attach(self, storage_path: str | None) -> None:
        """The exchange now exists; a type with state on disk keeps it at storage_path
        (None: the in-memory broker)."""

    def detach(self) -> None:
        """The exchange was deleted: drop what attach() opened."""

    @classmethod
    def for_exchange(cls, arguments: dict[str, Any]) -> ExchangeType:
        """The router for one exchange; types configured by arguments override this."""
        return cls()


class RefCounts(dict):
    """destination → number of bindings to it; one index entry per destination."""

    def add(self, destination: Any) -> None:
        self[destination] = self.get(destination, 0) + 1

    def remove(self, destination: Any) -> bool:
        """Drop one binding; True when the destination is gone from the index."""
        count = self.get(destination, 0)
        if count <= 1:
            self.pop(destination, None)
            return True
        self[destination] = count - 1
        return False
