"""Set up vhosts, users and permissions on the broker under test.

On Leveret through the embedded broker's admin operations; against the
reference RabbitMQ (LEVERET_TEST_URL set) through its management HTTP API, so
the access tests pin the same behaviour on both brokers.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

RABBITMQ_API = os.environ.get("LEVERET_TEST_MGMT", "http://127.0.0.1:15673/api")


class LeveretOperator:
    def __init__(self, embedded) -> None:
        self.admin = embedded.admin

    def add_vhost(self, name: str) -> None:
        self.admin.add_vhost(name)

    def delete_vhost(self, name: str) -> None:
        self.admin.delete_vhost(name)

    def add_user(self, name: str, password: str, tags: str = "") -> None:
        self.admin.add_user(name, password, tags)

    def delete_user(self, name: str) -> None:
        self.admin.delete_user(name)

    def set_permissions(self, user: str, vhost: str, conf: str, write: str, read: str) -> None:
        self.admin.set_permissions(user, vhost, conf, write, read)

    def clear_permissions(self, user: str, vhost: str) -> None:
        self.admin.clear_permissions(user, vhost)

    def set_topic_permissions(self, user, vhost, exchange, write, read) -> None:
        self.admin.set_topic_permissions(user, vhost, exchange, write, read)

    def set_vhost_limit(self, vhost: str, name: str, value: int) -> None:
        self.admin.set_vhost_limits(vhost, {name: value})

    def set_policy(
        self, vhost, name, pattern, definition, priority=0, apply_to="all", operator=False
    ):
        self.admin.set_policy(vhost, name, pattern, definition, priority, apply_to, operator)

    def clear_policy(self, vhost, name, operator=False) -> None:
        self.admin.clear_policy(vhost, name, operator)


class RabbitOperator:
    """Configures a broker through its management API: RabbitMQ's, or (given `api`) a
    Leveret broker's, such as the shared broker of workers under LEVERET_TEST_WORKERS."""

    def __init__(self, api: str = RABBITMQ_API) -> None:
        self.api = api
        self.created: list[str] = []

    def _call(self, method: str, path: str, body: dict | None = None) -> None:
        request = urllib.request.Request(
            self.api + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "content-type": "application/json",
                "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            },
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def add_vhost(self, name: str) -> None:
        self._call("PUT", f"/vhosts/{quote(name, safe='')}", {})
        self.created.append(f"/vhosts/{quote(name, safe='')}")

    def delete_vhost(self, name: str) -> None:
        self._call("DELETE", f"/vhosts/{quote(name, safe='')}")

    def add_user(self, name: str, password: str, tags: str = "") -> None:
        self._call("PUT", f"/users/{name}", {"password": password, "tags": tags})
        self.created.append(f"/users/{name}")

    def delete_user(self, name: str) -> None:
        self._call("DELETE", f"/users/{name}")

    def set_permissions(self, user, vhost, conf, write, read) -> None:
        self._call(
            "PUT",
            f"/permissions/{quote(vhost, safe='')}/{user}",
            {"configure": conf, "write": write, "read": read},
        )

    def clear_permissions(self, user: str, vhost: str) -> None:
        self._call("DELETE", f"/permissions/{quote(vhost, safe='')}/{user}")

    def set_topic_permissions(self, user, vhost, exchange, write, read) -> None:
        self._call(
            "PUT",
            f"/topic-permissions/{quote(vhost, safe='')}/{user}",
            {"exchange": exchange, "write": write, "read": read},
        )

    def set_vhost_limit(self, vhost: str, name: str, value: int) -> None:
        self._call("PUT", f"/vhost-limits/{quote(vhost, safe='')}/{name}", {"value": value})

    def set_policy(
        self, vhost, name, pattern, definition, priority=0, apply_to="all", operator=False
    ):
        kind = "operator-policies" if operator else "policies"
        path = f"/{kind}/{quote(vhost, safe='')}/{name}"
        body = {
            "pattern": pattern,
            "definition": definition,
            "priority": priority,
            "apply-to": apply_to,
        }
        self._call("PUT", path, body)
        self.created.append(path)

    def clear_policy(self, vhost, name, operator=False) -> None:
        kind = "operator-policies" if operator else "policies"
        self._call("DELETE", f"/{kind}/{quote(vhost, safe='')}/{name}")

    def cleanup(self) -> None:
        for path in reversed(self.created):
            try:
                self._call("DELETE", path)
            except urllib.error.HTTPError:
                pass  # already deleted by the test


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
