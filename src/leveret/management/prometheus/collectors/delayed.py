"""leveret_exchange_messages_delayed: what delayed exchanges hold back."""

from __future__ import annotations

from collections.abc import Iterator

from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, rendered


def _delayed(s: Scrape, per_object: bool) -> Rendered:
    """Messages delayed exchanges hold back (broker/exchanges/delayed.py), which
    RabbitMQ's plugin shows only as the exchange's messages_delayed: per exchange on
    /metrics/per-object, their sum on /metrics."""
    family = Family(
        "leveret_exchange_messages_delayed",
        "gauge",
        "Messages a delayed exchange holds until their x-delay has passed",
    )
    for vhost in s.vhosts:
        for x in vhost.exchanges.values():
            if x.type_name == "x-delayed-message":
                family.add(x.router.info()["messages_delayed"], vhost=vhost.name, exchange=x.name)
    return rendered(family, per_object=per_object)


class DelayedCollector:
    def collect(self, s: Scrape) -> Iterator[Rendered]:
        if s.mode != "detailed":
            yield _delayed(s, s.per_object)
