"""Deliberate differences in the translated suites, each with its docs/differences.md
entry; the management API's own allow-list applies here too."""

from __future__ import annotations

from ..common import Allowed

_S = "rabbit_mgmt_http_SUITE."

ALLOWED: list[Allowed] = [
    *(
        Allowed(
            _S + case,
            "*",
            "*",
            "differences.md#http-binding-arguments-hash",
            "the arguments' part of a binding's properties key is Leveret's own hash",
        )
        for case in ("arguments_test#[49]", "arguments_test#11", "bindings_post_test#*")
    ),
    Allowed(
        _S + "permissions_validation_test#2",
        "type",
        "reason",
        "differences.md#http-erlang-terms",
        "a bad regular expression's reason is a sentence, not an Erlang term",
    ),
    Allowed(
        _S + "vhosts_trace_test#[35]",
        "value",
        "tracing",
        "differences.md#http-trace-exchange",
        "Leveret has no firehose tracer: tracing stays false",
    ),
    *(
        Allowed(
            _S + case,
            "*",
            "*",
            "differences.md#http-password-hash-check",
            "a password hash that can never match is refused",
        )
        for case in (
            "users_test#6",
            "without_permissions_users_test#*",
            "adding_a_user_with_password_hash_test#*",
            "definitions_password_test#[23]",
        )
    ),
    Allowed(
        _S + "aliveness_test#4",
        "*",
        "*",
        "differences.md#http-aliveness-queue",
        "the aliveness check leaves no queue behind",
    ),
    Allowed(
        _S + "bindings_null_routing_key_test#[789]",
        "*",
        "*",
        "differences.md#http-null-routing-key",
        "a null routing key is refused",
    ),
]
