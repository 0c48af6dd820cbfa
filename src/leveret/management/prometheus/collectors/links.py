"""Prometheus families for shovels and federation links (read on each scrape).

- `leveret_shovel_messages_total{vhost, shovel}`: messages a shovel moved (acked
  at the source) since this broker started;
- `leveret_shovel_running{vhost, shovel}`: 1 while it runs, 0 while it starts or
  is terminated;
- `leveret_federation_link_messages_total{vhost, type, name, upstream}` and
  `leveret_federation_link_running{...}`: the same per federation link.

A link that was deleted keeps its count until the broker restarts, so a counter
never goes backwards while the process lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, rendered


class LinkManager(Protocol):
    """What these families read of leveret.links.manager.LinkManager."""

    #: ("shovel", vhost, name) / ("federation", vhost, kind, name, upstream) -> moved
    moved: dict[tuple[str, ...], int]
    shovels: dict[tuple[str, str], Any]  # (vhost, name) -> Shovel, with its `state`
    federation: Any  # Federation, its `links` by (vhost, kind, name, upstream), or None


def families(manager: LinkManager) -> list[Rendered]:
    shovel_moved = Family("leveret_shovel_messages", "counter", "Messages a shovel moved")
    shovel_running = Family("leveret_shovel_running", "gauge", "1 while a shovel runs, else 0")
    link_moved = Family(
        "leveret_federation_link_messages", "counter", "Messages a federation link moved"
    )
    link_running = Family(
        "leveret_federation_link_running", "gauge", "1 while a federation link runs, else 0"
    )
    for key, n in sorted(manager.moved.items()):
        if key[0] == "shovel":
            shovel_moved.add(n, vhost=key[1], shovel=key[2])
        else:
            link_moved.add(n, vhost=key[1], type=key[2], name=key[3], upstream=key[4])
    for (vhost, name), shovel in sorted(manager.shovels.items()):
        if ("shovel", vhost, name) not in manager.moved:
            shovel_moved.add(0, vhost=vhost, shovel=name)
        shovel_running.add(1 if shovel.state == "running" else 0, vhost=vhost, shovel=name)
    federation = manager.federation
    for (vhost, kind, name, upstream), link in sorted(
        federation.links.items() if federation else []
    ):
        labels = {"vhost": vhost, "type": kind, "name": name, "upstream": upstream}
        if ("federation", vhost, kind, name, upstream) not in manager.moved:
            link_moved.add(0, **labels)
        link_running.add(1 if link.status_name == "running" else 0, **labels)
    return [rendered(f) for f in (shovel_moved, shovel_running, link_moved, link_running)]


class LinksCollector:
    def __init__(self, manager: LinkManager) -> None:
        self.manager = manager

    def collect(self, s: Scrape) -> Iterator[Rendered]:
        if s.mode != "detailed":
            yield from families(self.manager)
