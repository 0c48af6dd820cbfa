"""headers: match on the message's headers table instead of the routing key.

`x-match` = all (default) | any; the `-with-x` variants also compare keys that
start with `x-`, which plain all/any ignore, as in RabbitMQ.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.errors import PreconditionFailed
from leveret.broker.exchanges.base import ExchangeType
from leveret.broker.queue_args import same_value

_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def _same(a: Any, b: Any) -> bool:
    """RabbitMQ 3.10 compares a binding's value with the header's as Erlang's `==`
    does, whatever their field types: 1 (byte) equals 1 (long) and 1.0 (float), not
    "1" or true (recorded: tests/compat/amqp, protocol.headers_exchange_modes)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return same_value(a, b)


class HeadersExchange(ExchangeType):
    name = "headers"

    def __init__(self) -> None:
        self._bindings: list[tuple[Any, str, list[tuple[str, Any]], bool]] = []

    @classmethod
    def validate_binding(cls, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode(errors="replace")
        if mode not in _MATCH_MODES:
            shown = f'<<"{mode}">>' if isinstance(mode, str) else str(mode)  # as Erlang prints
            raise PreconditionFailed(
                f"Invalid x-match field value {shown}; expected all, any, all-with-x, "
                "or any-with-x",
            )

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode()
        with_x = mode.endswith("-with-x")
        pairs = [
            (key, value)
            for key, value in arguments.items()
            if key != "x-match" and (with_x or not key.startswith("x-"))
        ]
        self._bindings.append((destination, mode, pairs, mode.startswith("any")))

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        probe = HeadersExchange()
        probe.bind(destination, routing_key, arguments)
        target = probe._bindings[0]
        for i, binding in enumerate(self._bindings):
            if binding[0] is destination and binding[1] == target[1] and binding[2] == target[2]:
                del self._bindings[i]
                return

    def route(self, routing_key: str, message: Any):
        headers = message.headers or {}
        out = []
        for destination, _mode, pairs, any_mode in self._bindings:
            if any_mode:
                ok = any(_pair_matches(headers, k, v) for k, v in pairs)
            else:
                ok = all(_pair_matches(headers, k, v) for k, v in pairs)
            if ok:
                out.append(destination)
        return dict.fromkeys(out)


def _pair_matches(headers: dict[str, Any], key: str, value: Any) -> bool:
    if key not in headers:
        return False
    # A void binding value asks only that the header be present.
    return value is None or _same(headers[key], value)
