"""A user's permissions given in the same PUT as the user (RabbitMQ's `permissions`
field): they apply at once, and a malformed entry is refused, naming what is missing.
Runs against the reference RabbitMQ too with LEVERET_TEST_URL set."""

from __future__ import annotations

import pytest

from access_setup import unique
from conftest import EXTERNAL_URL
from test_management_api import api, call  # noqa: F401 - the fixture and the helper


def test_permissions_in_the_user_body_apply(api):  # noqa: F811
    user, vhost = unique("pp-user"), unique("pp-vhost")
    assert call(api, "PUT", f"/vhosts/{vhost}")[0] == 201
    try:
        body = {
            "password": "pw",
            "tags": "management",
            "permissions": {vhost: {"configure": ".*", "write": ".*", "read": ".*"}},
        }
        assert call(api, "PUT", f"/users/{user}", body)[0] == 201
        status, perms = call(api, "GET", f"/users/{user}/permissions")
        assert status == 200
        assert [(p["vhost"], p["configure"]) for p in perms] == [(vhost, ".*")]
        # the user may now declare in that vhost
        assert call(api, "PUT", f"/queues/{vhost}/q", {}, user=user, password="pw")[0] == 201
    finally:
        call(api, "DELETE", f"/users/{user}")
        call(api, "DELETE", f"/vhosts/{vhost}")


@pytest.mark.parametrize("entry", [{"configure": ".*"}, "all"])
def test_a_malformed_permissions_entry_is_refused(api, entry):  # noqa: F811
    user, vhost = unique("pp-user"), unique("pp-vhost")
    assert call(api, "PUT", f"/vhosts/{vhost}")[0] == 201
    try:
        body = {"password": "pw", "tags": "", "permissions": {vhost: entry}}
        status, answer = call(api, "PUT", f"/users/{user}", body)
        if EXTERNAL_URL:  # RabbitMQ crashes: docs/differences.md#http-crash
            assert status == 500
            return
        assert status == 400
        assert answer["error"] == "bad_request"
        assert answer["reason"]
    finally:
        call(api, "DELETE", f"/users/{user}")
        call(api, "DELETE", f"/vhosts/{vhost}")
