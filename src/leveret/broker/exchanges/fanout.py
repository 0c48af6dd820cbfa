"""fanout: every bound destination gets every message."""

from __future__ import annotations

from typing import Any

from leveret.broker.exchanges.base import ExchangeType, RefCounts


class FanoutExchange(ExchangeType):
    name = "fanout"

    def __init__(self) -> None:
        self._dests = RefCounts()

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self._dests.add(destination)

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self._dests.remove(destination)

    def route(self, routing_key: str, message: Any):
        return self._dests
