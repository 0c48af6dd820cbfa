"""Where Leveret answers an access-control case differently from RabbitMQ 3.10, on purpose.

Each difference is one step of a case (path `steps.N`); the replay fails on any other
difference, and on an entry here that no longer allows anything.
"""

from __future__ import annotations

from ..common import Allowed

_REVOKED = (
    "differences.md#access-revoked",
    "a revoked permission applies to open channels from their next operation; RabbitMQ "
    "keeps a per-channel cache of what it allowed before",
)
_LOGIN = (
    "differences.md#access-login-syntax",
    "a client that announced authentication_failure_close gets a 403 that says what was "
    "wrong; RabbitMQ drops the socket without a word",
)

ALLOWED: list[Allowed] = [
    Allowed("revoked-same-resource", "value", "steps.3", *_REVOKED),
    Allowed("revoked-publish", "value", "steps.3", *_REVOKED),
    Allowed("login-external-without-tls", "value", "steps.0", *_LOGIN),
    Allowed("login-unknown-mechanism", "value", "steps.0", *_LOGIN),
    Allowed("login-plain-malformed-response", "value", "steps.0", *_LOGIN),
    Allowed(
        "api-user-limits-errors",
        "value",
        "steps.9",
        "differences.md#access-user-limits-missing-user",
        "DELETE of a limit of a user that does not exist is a 404, as for any missing object; "
        "RabbitMQ 3.10 fails with a 500 and no body",
    ),
]
