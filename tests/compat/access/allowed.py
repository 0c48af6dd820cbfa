"""Where Leveret answers an access-control case differently from RabbitMQ 3.10, on purpose.

case name -> {step index: Leveret's answer, "why": ..., "doc": anchor in docs/differences.md}.
The replay checks that Leveret gives exactly this answer at that step (and RabbitMQ's
everywhere else), and that the recording still differs there: an entry that no longer
differs must go.
"""

from __future__ import annotations

from typing import Any

_REFUSED = "ACCESS_REFUSED - access to {} '{}' in vhost 'access' refused for user 'alice'"
_MECHANISM = "ACCESS_REFUSED - unsupported authentication mechanism '{}'; supported: PLAIN AMQPLAIN"
_LOGIN = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)
_REVOKED = {
    "why": "a revoked permission applies to open channels from their next operation; "
    "RabbitMQ keeps a per-channel cache of what it allowed before",
    "doc": "differences.md#access-revoked",
}
_CLEAR_LOGIN_ERROR = {
    "why": "a client that announced authentication_failure_close gets a 403 that says what "
    "was wrong; RabbitMQ drops the socket without a word",
    "doc": "differences.md#access-login-syntax",
}

ALLOWED: dict[str, dict[Any, Any]] = {
    "revoked-same-resource": {
        3: {"channel.close": [403, _REFUSED.format("queue", "alice-1"), 50, 10]},
        **_REVOKED,
    },
    "revoked-publish": {
        3: {"channel.close": [403, _REFUSED.format("exchange", "alice-x"), 60, 40]},
        **_REVOKED,
    },
    "api-user-limits-errors": {
        9: {"status": 404, "body": {"error": "Object Not Found", "reason": "Not Found"}},
        "why": "DELETE of a limit of a user that does not exist is a 404, as for any missing "
        "object; RabbitMQ 3.10 fails with a 500 and no body",
        "doc": "differences.md#access-user-limits-missing-user",
    },
    "login-external-without-tls": {
        0: {"connection.close": [403, _MECHANISM.format("EXTERNAL"), 0, 0]},
        **_CLEAR_LOGIN_ERROR,
    },
    "login-unknown-mechanism": {
        0: {"connection.close": [403, _MECHANISM.format("CRAM-MD5"), 0, 0]},
        **_CLEAR_LOGIN_ERROR,
    },
    "login-plain-malformed-response": {
        0: {"connection.close": [403, _LOGIN, 0, 0]},
        **_CLEAR_LOGIN_ERROR,
    },
}
