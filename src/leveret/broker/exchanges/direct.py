"""direct: the routing key must equal the binding key."""

from __future__ import annotations

from typing import Any

from leveret.broker.exchanges.base import ExchangeType, RefCounts


class DirectExchange(ExchangeType):
    name = "direct"

    def __init__(self) -> None:
        self._by_key: dict[str, RefCounts] = {}

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self._by_key.setdefault(routing_key, RefCounts()).add(destination)

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        dests = self._by_key.get(routing_key)
        if dests is not None:
            dests.remove(destination)
            if not dests:
                del self._by_key[routing_key]

    def route(self, routing_key: str, message: Any):
        return self._by_key.get(routing_key, ())
