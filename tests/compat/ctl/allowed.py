"""Deliberate differences of `leveret ctl` from rabbitmqctl 3.10.8 in the ctl cases,
each with its entry in docs/differences.md."""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = [
    Allowed(
        case="global_parameters.*",
        kind="exit",
        path="*",
        anchor="differences.md#ctl-exit-status",
        reason="both fail; leveret ctl gives each status one meaning across its commands "
        "(2 usage, a bad JSON value included; 1 refused; 69 only when no broker answers)",
    ),
]
