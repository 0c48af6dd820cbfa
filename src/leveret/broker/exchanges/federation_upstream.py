"""x-federation-upstream: the exchange a federation link makes on its upstream.

A fanout (to the link's queue) that drops what the downstream would drop
anyway: a message that has already made `x-max-hops` hops (the length of its
`x-received-from` header), or that has already passed through the downstream
broker (`x-downstream-name`) and vhost (`x-downstream-vhost`). RabbitMQ's
federation declares this type on its upstreams and falls back to a plain
fanout where the type is missing; Leveret has it, so RabbitMQ federating from
Leveret filters at the source, as between two RabbitMQs.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.errors import PreconditionFailed
from leveret.broker.exchanges.fanout import FanoutExchange

RECEIVED_FROM = "x-received-from"


class FederationUpstreamExchange(FanoutExchange):
    name = "x-federation-upstream"

    def __init__(self, max_hops: int = 1, downstream: Any = None, vhost: Any = None) -> None:
        super().__init__()
        self.max_hops = max_hops
        self.downstream = _text(downstream)
        self.vhost = _text(vhost)

    @classmethod
    def for_exchange(cls, arguments: dict[str, Any]) -> FederationUpstreamExchange:
        hops = arguments.get("x-max-hops", 1)
        return cls(
            hops if isinstance(hops, int) else 1,
            arguments.get("x-downstream-name"),
            arguments.get("x-downstream-vhost"),
        )

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any]) -> None:
        hops = arguments.get("x-max-hops")
        if hops is None:
            raise PreconditionFailed("Argument x-max-hops missing")
        if isinstance(hops, bool) or not isinstance(hops, int):
            raise PreconditionFailed("Argument x-max-hops must be of type long")

    def route(self, routing_key: str, message: Any):
        headers = message.headers
        if headers:
            seen = headers.get(RECEIVED_FROM)
            if isinstance(seen, list):
                if len(seen) >= self.max_hops:
                    return ()
                for entry in seen:
                    if (
                        isinstance(entry, dict)
                        and _text(entry.get("cluster-name")) == self.downstream
                        and _text(entry.get("vhost")) == self.vhost
                    ):
                        return ()
        return self._dests


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
