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
