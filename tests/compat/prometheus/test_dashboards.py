"""Every family RabbitMQ's Grafana dashboards and alerts read (dashboards.py) is served
by Leveret, or NOT_SERVED says why."""

from __future__ import annotations

import fnmatch

import pytest

from .dashboards import DASHBOARDS
from .replay import leveret_scrape

#: family pattern -> why Leveret does not serve it
NOT_SERVED = {
    "erlang_vm_*": "Erlang VM internals (memory allocators, distribution links between "
    "Erlang nodes): Leveret is not an Erlang VM (docs/differences.md#prometheus-erlang)",
    "rabbitmq_global_stream_error_*": "errors of RabbitMQ's stream protocol (port 5552), "
    "which Leveret does not speak; a RabbitMQ without the rabbitmq_stream plugin has none "
    "either (docs/differences.md#prometheus-stream-protocol)",
}


def _names(scraped: dict) -> set[str]:
    names: set[str] = set()
    for endpoint in scraped.values():
        names.update(endpoint.get("families", {}))
    return names


@pytest.fixture(scope="module")
def served():
    with leveret_scrape() as scraped:
        return _names(scraped)


def coverage(served: set[str]) -> dict[str, tuple[int, int]]:
    """dashboard or alert -> (families served, families read)."""
    return {
        name: (sum(1 for f in families if f in served), len(families))
        for name, families in DASHBOARDS.items()
    }


@pytest.mark.parametrize("dashboard", sorted(DASHBOARDS))
def test_dashboard_families_are_served(served, dashboard):
    missing = [
        f
        for f in DASHBOARDS[dashboard]
        if f not in served and not any(fnmatch.fnmatchcase(f, p) for p in NOT_SERVED)
    ]
    assert missing == []


def test_not_served_patterns_are_still_needed(served):
    every = {f for families in DASHBOARDS.values() for f in families}
    for pattern in NOT_SERVED:
        matching = [f for f in every if fnmatch.fnmatchcase(f, pattern)]
        assert matching and not any(f in served for f in matching), pattern
