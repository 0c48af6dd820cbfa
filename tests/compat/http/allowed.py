"""Deliberate differences of the management API from RabbitMQ 3.10.8, each with its
entry in docs/differences.md. (Differences not yet closed are in known_gaps.txt.)"""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = [
    Allowed(
        case="*",
        kind="crash",
        path="",
        anchor="differences.md#http-crash",
        reason="where RabbitMQ crashes (500, no body) on bad input, Leveret answers 400 "
        "with an error body naming the problem; the replay checks it is a 4xx error body",
    ),
    Allowed(
        case="*",
        kind="value",
        path="*exchange_types",
        anchor="differences.md#plugins-exchange-types",
        reason="Leveret also lists its built-in x-deduplication and x-delayed-message exchange "
        "types",
    ),
]
