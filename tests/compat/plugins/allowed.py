"""Deliberate differences of Leveret's shovels and federation from RabbitMQ 3.10.8's
plugins, each with its entry in docs/differences.md."""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = [
    *(
        Allowed(
            case=f"shovel.invalid.{name}*",
            kind="value",
            path="reason",
            anchor="differences.md#plugins-long-erlang-terms",
            reason="the same Erlang term, on one line rather than wrapped by Erlang's printer",
        )
        for name in ("bad_escape", "heartbeat_not_integer")
    ),
    Allowed(
        case="shovel.invalid.value_not_object*",
        kind="*",
        path="*",
        anchor="differences.md#plugins-stricter-validation",
        reason="RabbitMQ crashes (500, no body); Leveret answers 400 naming the problem",
    ),
    Allowed(
        case="shovel.invalid.negative_prefetch*",
        kind="*",
        path="*",
        anchor="differences.md#plugins-stricter-validation",
        reason="RabbitMQ accepts a shovel that fails at run time; Leveret refuses it (400)",
    ),
    Allowed(
        case="shovel.status.unreachable*",
        kind="extra",
        path="[].reason",
        anchor="differences.md#plugins-shovel-reason",
        reason="a shovel that cannot connect says why",
    ),
]
