"""`leveret ctl --url`: the same commands over the management HTTP API.

The control socket (server.ctl_socket) only reaches a broker on this machine,
as the account that runs it. When the broker runs elsewhere, `leveret ctl`
takes `--url` and credentials instead and turns each command into the calls
RabbitMQ's management API documents, so it also works against RabbitMQ 3.10+
itself. Results come back in the control socket's shapes, so tables, JSON
output and error messages are the same whichever way a command travelled.

A few commands take more than one call, because the API has no single call for
them (a user's tags without its password, one of several topic permissions,
all of a vhost's limits); those are not atomic against a concurrent change.
"""

from __future__ import annotations

import base64
import html
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from leveret.broker.admin import VHOST_LIMITS
from leveret.ctl import EXIT_NOPERM, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, CtlError


def _q(name: str) -> str:
    """One path segment: "/" is %2F, as the API wants vhost names."""
    return quote(name, safe="")


class ApiError(Exception):
    """An HTTP error status with RabbitMQ's {"error", "reason"} body."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HttpControl:
    """Runs ctl operations (ctl._request's names and arguments) against a management API."""

    def __init__(self, url: str, username: str, password: str, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(
                f"--url must be http://HOST:PORT or https://HOST:PORT, got {url!r}", EXIT_USAGE
            )
        # user:password@ in the URL stands in for --username/--password.
        if parts.username is not None:
            username, password = parts.username, parts.password or ""
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.username = username
        self.timeout = timeout
        self._auth = self._basic(username, password)

    @staticmethod
    def _basic(username: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    # --- transport ------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, auth: str | None = None) -> Any:
        """One API call; the decoded JSON (None for an empty body). ApiError on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + "/api" + path, data=data, method=method)
        req.add_header("Authorization", auth or self._auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                text = res.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _reason(exc.read(), exc.reason)) from None
        except http.client.HTTPException:
            raise CtlError(
                f"{self.base} does not answer in HTTP: is --url the broker's management port?",
                EXIT_UNAVAILABLE,
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise CtlError(
                f"cannot reach the management API at {self.base}: {why}", EXIT_UNAVAILABLE
            ) from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            raise CtlError(
                f"{self.base} did not answer {method} /api{path} with JSON: "
                "is --url the broker's management port?",
                EXIT_UNAVAILABLE,
            ) from None

    def call(self, op: str, args: dict[str, Any]) -> Any:
        handler: Callable[..., Any] | None = getattr(self, "op_" + op, None)
        if handler is None:
            raise CtlError(f"{op} is not available over --url", EXIT_REFUSED)
        try:
            return handler(**args)
        except ApiError as exc:
            raise self._error(op, exc) from None

    def _error(self, op: str, exc: ApiError) -> CtlError:
        if exc.status == 401 and exc.reason == "Login failed":
            text = (
                f"the management API at {self.base} refused user '{self.username}': "
                "login failed (check --username and --password)"
            )
            return CtlError(text, EXIT_NOPERM)
        if exc.status == 401 and exc.reason == "Not management user":
            text = f"user '{self.username}' has no management tag, so it cannot use the API"
            return CtlError(text, EXIT_NOPERM)
        if exc.status in (401, 403):
            return CtlError(f"user '{self.username}' may not {op}: {exc.reason}", EXIT_NOPERM)
        # For a 404 the op_* methods have put in a text naming what is missing.
        return CtlError(exc.reason, EXIT_REFUSED)

    def _get_or(self, path: str, missing: str) -> Any:
        """GET that turns a 404 into a message naming what is missing."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(404, missing) from None
            raise

    def _exists(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _vhost(self, name: str) -> Any:
        return self._get_or(f"/vhosts/{_q(name)}", f"vhost '{name}' does not exist")

    def _user(self, name: str) -> Any:
        return self._get_or(f"/users/{_q(name)}", f"user '{name}' does not exist")

    def _delete(self, path: str, missing: Callable[[], str]) -> None:
        try:
            self.request("DELETE", path)
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(404, missing()) from None
            raise

    def _user_and_vhost(self, user: str, vhost: str) -> None:
        """Name whichever of the two is missing, as the control socket does."""
        self._user(user)
        self._vhost(vhost)

    # --- vhosts ---------------------------------------------------------------

    def op_add_vhost(self, name: str, description: str = "") -> None:
        # The API's PUT succeeds on an existing vhost; ctl refuses, as rabbitmqctl does.
        if self._exists(f"/vhosts/{_q(name)}"):
            raise ApiError(400, f"vhost '{name}' already exists")
        self.request("PUT", f"/vhosts/{_q(name)}", {"description": description})
        # The API grants whoever creates a vhost full permissions in it (as RabbitMQ's
        # does); `ctl add_vhost`, like rabbitmqctl's, grants nobody anything.
        self.request("DELETE", f"/permissions/{_q(name)}/{_q(self.username)}")

    def op_delete_vhost(self, name: str) -> None:
        self._delete(f"/vhosts/{_q(name)}", lambda: f"vhost '{name}' does not exist")

    def op_list_vhosts(self) -> list[dict[str, Any]]:
        limits = {r["vhost"]: r["value"] for r in self.request("GET", "/vhost-limits") or []}
        return [
            {
                "name": v["name"],
                "description": v.get("description", ""),
                "tags": _tags(v.get("tags", [])),
                "limits": limits.get(v["name"], {}),
            }
            for v in sorted(self.request("GET", "/vhosts"), key=lambda v: v["name"])
        ]

    def op_set_vhost_limits(self, name: str, limits: Any) -> None:
        self._vhost(name)
        if not isinstance(limits, dict) or not limits:
            raise ApiError(400, 'limits must be a non-empty object, e.g. {"max-queues": 10}')
        for key, value in limits.items():
            # The same checks and messages as `leveret ctl` on the broker's own socket.
            if key not in VHOST_LIMITS:
                known = ", ".join(VHOST_LIMITS)
                raise ApiError(400, f"unknown vhost limit '{key}'; known limits: {known}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ApiError(400, f"vhost limit '{key}' must be an integer, got {value!r}")
        for key, value in limits.items():
            self.request("PUT", f"/vhost-limits/{_q(name)}/{_q(key)}", {"value": value})

    def op_clear_vhost_limits(self, name: str) -> None:
        self._vhost(name)
        for row in self.request("GET", f"/vhost-limits/{_q(name)}") or []:
            for key in row["value"]:
                self.request("DELETE", f"/vhost-limits/{_q(name)}/{_q(key)}")

    # --- users ----------------------------------------------------------------

    def op_add_user(self, name: str, password: str, tags: str = "") -> None:
        if self._exists(f"/users/{_q(name)}"):
            raise ApiError(400, f"user '{name}' already exists")
        self.request("PUT", f"/users/{_q(name)}", {"password": password, "tags": tags})

    def op_delete_user(self, name: str) -> None:
        self._delete(f"/users/{_q(name)}", lambda: f"user '{name}' does not exist")

    def _put_user(self, name: str, user: dict[str, Any], **fields: Any) -> None:
        """Replace a user, keeping whatever `fields` does not change."""
        body: dict[str, Any] = {"tags": ",".join(_tags(user.get("tags", [])))}
        if "password" not in fields:
            body["password_hash"] = user.get("password_hash", "")
            body["hashing_algorithm"] = user.get(
                "hashing_algorithm", "rabbit_password_hashing_sha256"
            )
        body.update(fields)
        self.request("PUT", f"/users/{_q(name)}", body)

    def op_change_password(self, name: str, password: str) -> None:
        self._put_user(name, self._user(name), password=password)

    def op_clear_password(self, name: str) -> None:
        self._put_user(name, self._user(name), password_hash="")

    def op_set_user_tags(self, name: str, tags: list[str]) -> None:
        self._put_user(name, self._user(name), tags=",".join(tags))

    def op_authenticate_user(self, name: str, password: str) -> bool:
        """Ask the API who these credentials are: 401 "Login failed" means a wrong password."""
        self._user(name)
        try:
            self.request("GET", "/whoami", auth=self._basic(name, password))
        except ApiError as exc:
            if exc.status != 401:
                raise
            return exc.reason == "Not management user"  # right password, no management tag
        return True

    def op_list_users(self) -> list[dict[str, Any]]:
        users = sorted(self.request("GET", "/users"), key=lambda u: u["name"])
        return [{"name": u["name"], "tags": _tags(u.get("tags", []))} for u in users]

    # --- permissions ----------------------------------------------------------

    def op_set_user_limits(self, name: str, limits: Any) -> None:
        self._user(name)
        if not isinstance(limits, dict):
            raise ApiError(400, 'limits must be a JSON object, e.g. {"max-connections": 10}')
        for key, value in limits.items():
            self.request("PUT", f"/user-limits/{_q(name)}/{_q(key)}", {"value": value})

    def op_clear_user_limits(self, name: str, key: str = "all") -> None:
        self._user(name)
        rows = self.request("GET", f"/user-limits/{_q(name)}") or []
        for row in rows:
            for limit in row["value"]:
                if key in ("all", limit):
                    self.request("DELETE", f"/user-limits/{_q(name)}/{_q(limit)}")

    def op_list_user_limits(self, name: str | None = None) -> list[dict[str, Any]]:
        if name is not None:
            self._user(name)
            return self.request("GET", f"/user-limits/{_q(name)}") or []
        return self.request("GET", "/user-limits") or []

    def op_set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None:
        self._user_and_vhost(user, vhost)
        body = {"configure": configure, "write": write, "read": read}
        self.request("PUT", f"/permissions/{_q(vhost)}/{_q(user)}", body)

    def op_clear_permissions(self, user: str, vhost: str) -> None:
        self._user_and_vhost(user, vhost)
        self._delete(
            f"/permissions/{_q(vhost)}/{_q(user)}",
            lambda: f"user '{user}' has no permissions in vhost '{vhost}'",
        )

    def op_list_permissions(
        self, vhost: str | None = None, user: str | None = None
    ) -> list[dict[str, Any]]:
        if user is not None:
            self._user(user)
            rows = self.request("GET", f"/users/{_q(user)}/permissions")
        else:
            assert vhost is not None
            self._vhost(vhost)
            rows = self.request("GET", f"/vhosts/{_q(vhost)}/permissions")
        keys = ("user", "vhost", "configure", "write", "read")
        return [
            {k: r[k] for k in keys} for r in sorted(rows, key=lambda r: (r["user"], r["vhost"]))
        ]

    def op_set_topic_permissions(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> None:
        self._user_and_vhost(user, vhost)
        body = {"exchange": exchange, "write": write, "read": read}
        self.request("PUT", f"/topic-permissions/{_q(vhost)}/{_q(user)}", body)

    def op_clear_topic_permissions(
        self, user: str, vhost: str, exchange: str | None = None
    ) -> None:
        self._user_and_vhost(user, vhost)
        path = f"/topic-permissions/{_q(vhost)}/{_q(user)}"
        existing = self.request("GET", path) or []
        names = [t["exchange"] for t in existing]
        if not names or (exchange is not None and exchange not in names):
            raise ApiError(
                404,
                f"user '{user}' has no topic permissions in vhost '{vhost}'"
                + (f" for exchange '{exchange}'" if exchange else ""),
            )
        # The API deletes a user's topic permissions in a vhost all at once: put the others back.
        self.request("DELETE", path)
        for t in existing:
            if exchange is not None and t["exchange"] != exchange:
                body = {"exchange": t["exchange"], "write": t["write"], "read": t["read"]}
                self.request("PUT", path, body)

    def op_list_topic_permissions(self, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        rows = self.request("GET", f"/vhosts/{_q(vhost)}/topic-permissions")
        keys = ("user", "vhost", "exchange", "write", "read")
        return [
            {k: r[k] for k in keys}
            for r in sorted(rows, key=lambda r: (r["user"], r["vhost"], r["exchange"]))
        ]

    # --- policies -------------------------------------------------------------

    def _set_policy(self, kind: str, vhost: str, name: str, **policy: Any) -> None:
        self._vhost(vhost)
        body = {
            "pattern": policy["pattern"],
            "definition": policy["definition"],
            "priority": policy["priority"],
            "apply-to": policy["apply_to"],
        }
        try:
            self.request("PUT", f"/{kind}/{_q(vhost)}/{_q(name)}", body)
        except ApiError as exc:  # RabbitMQ's API escapes < and > in a policy's texts
            raise ApiError(exc.status, html.unescape(exc.reason)) from None

    def _clear_policy(self, kind: str, what: str, vhost: str, name: str) -> None:
        self._vhost(vhost)
        self._delete(
            f"/{kind}/{_q(vhost)}/{_q(name)}",
            lambda: f"{what} '{name}' does not exist in vhost '{vhost}'",
        )

    def _list_policies(self, kind: str, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        keys = ("name", "pattern", "apply-to", "definition", "priority")
        rows = sorted(self.request("GET", f"/{kind}/{_q(vhost)}"), key=lambda p: p["name"])
        return [{"vhost": vhost, **{k: p[k] for k in keys}} for p in rows]

    def op_set_policy(self, vhost: str, name: str, **policy: Any) -> None:
        self._set_policy("policies", vhost, name, **policy)

    def op_set_operator_policy(self, vhost: str, name: str, **policy: Any) -> None:
        self._set_policy("operator-policies", vhost, name, **policy)

    def op_clear_policy(self, vhost: str, name: str) -> None:
        self._clear_policy("policies", "policy", vhost, name)

    def op_clear_operator_policy(self, vhost: str, name: str) -> None:
        self._clear_policy("operator-policies", "operator policy", vhost, name)

    def op_list_policies(self, vhost: str) -> list[dict[str, Any]]:
        return self._list_policies("policies", vhost)

    def op_list_operator_policies(self, vhost: str) -> list[dict[str, Any]]:
        return self._list_policies("operator-policies", vhost)

    # --- what a vhost holds ---------------------------------------------------

    def op_list_queues(self, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        return [
            {
                "name": q["name"],
                "messages": q.get("messages", 0),
                "consumers": q.get("consumers", 0),
                "type": q.get("type", "classic"),
                "durable": q["durable"],
                "auto_delete": q["auto_delete"],
                "exclusive": bool(q.get("exclusive")),
            }
            for q in sorted(self.request("GET", f"/queues/{_q(vhost)}"), key=lambda q: q["name"])
        ]

    def op_list_exchanges(self, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        keys = ("name", "type", "durable", "auto_delete", "internal")
        rows = sorted(self.request("GET", f"/exchanges/{_q(vhost)}"), key=lambda x: x["name"])
        return [{k: x[k] for k in keys} for x in rows]

    def op_list_bindings(self, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        return [
            {
                "source_name": b["source"],
                "source_kind": "exchange",
                "destination_name": b["destination"],
                "destination_kind": b["destination_type"],
                "routing_key": b["routing_key"],
                "arguments": {k: str(v) for k, v in (b.get("arguments") or {}).items()},
            }
            for b in self.request("GET", f"/bindings/{_q(vhost)}")
        ]

    def op_list_connections(self) -> list[dict[str, Any]]:
        rows = []
        for c in self.request("GET", "/connections"):
            props = c.get("client_properties") or {}
            rows.append(
                {
                    "name": c["name"],
                    "user": c.get("user"),
                    "vhost": c.get("vhost"),
                    "channels": c.get("channels", 0),
                    "client": str(props.get("product", "")),
                    "connection_name": str(props.get("connection_name", "")),
                }
            )
        return sorted(rows, key=lambda r: r["name"])

    def op_list_mqtt_connections(self) -> list[dict[str, Any]]:
        rows = []
        for c in self.request("GET", "/connections"):
            if not str(c.get("protocol", "")).startswith("MQTT"):
                continue
            props = c.get("client_properties") or {}
            rows.append(
                {
                    "client_id": props.get("client_id"),
                    "conn_name": c["name"],
                    "user": c.get("user"),
                    "vhost": c.get("vhost"),
                    "protocol": c.get("protocol"),
                }
            )
        return sorted(rows, key=lambda r: r["conn_name"])

    # --- runtime parameters, shovels, federation (leveret.links) ---------------

    def op_set_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        self._vhost(vhost)
        path = f"/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}"
        try:
            self.request("PUT", path, {"value": value})
        except ApiError as exc:  # RabbitMQ's API escapes < and > in these texts
            raise ApiError(exc.status, html.unescape(exc.reason)) from None

    def op_clear_parameter(self, vhost: str, component: str, name: str) -> None:
        self._vhost(vhost)
        self._delete(
            f"/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}",
            lambda: f"no {component} parameter '{name}' in vhost '{vhost}'",
        )

    def op_list_parameters(self, vhost: str) -> list[dict[str, Any]]:
        self._vhost(vhost)
        rows = self.request("GET", "/parameters")
        return [
            {"component": p["component"], "name": p["name"], "value": p["value"]}
            for p in sorted(rows, key=lambda p: (p["component"], p["name"]))
            if p["vhost"] == vhost
        ]

    # --- global runtime parameters and the cluster name ------------------------

    def op_set_cluster_name(self, name: str) -> None:
        self.request("PUT", "/cluster-name", {"name": name})

    def _global_path(self, name: str) -> str:
        if not name:  # /api/global-parameters/ is the listing, not a parameter
            raise ApiError(400, "a global parameter's name cannot be empty over --url")
        return f"/global-parameters/{_q(name)}"

    def op_set_global_parameter(self, name: str, value: Any) -> None:
        self.request("PUT", self._global_path(name), {"value": value})

    def op_clear_global_parameter(self, name: str) -> None:
        self._delete(self._global_path(name), lambda: f"no global parameter '{name}'")

    def op_list_global_parameters(self) -> list[dict[str, Any]]:
        # RabbitMQ's API shows the name "" (rabbitmqctl can set it) as null.
        rows = [
            {"name": p["name"] or "", "value": p["value"]}
            for p in self.request("GET", "/global-parameters") or []
        ]
        return sorted(rows, key=lambda p: p["name"])

    def op_shovel_status(self) -> list[dict[str, Any]]:
        return self.request("GET", "/shovels")

    def op_restart_shovel(self, vhost: str, name: str) -> None:
        self._delete(
            f"/shovels/vhost/{_q(vhost)}/{_q(name)}/restart",
            lambda: f"shovel '{name}' in vhost '{vhost}' does not exist",
        )

    def op_delete_shovel(self, vhost: str, name: str) -> None:
        self._delete(
            f"/shovels/vhost/{_q(vhost)}/{_q(name)}",
            lambda: f"shovel '{name}' in vhost '{vhost}' does not exist",
        )

    def op_federation_status(self) -> list[dict[str, Any]]:
        return self.request("GET", "/federation-links")

    # --- definitions ----------------------------------------------------------

    def op_export_definitions(self, vhost: str | None = None) -> Any:
        if vhost is None:
            return self.request("GET", "/definitions")
        return self._get_or(f"/definitions/{_q(vhost)}", f"vhost '{vhost}' does not exist")

    def op_import_definitions(self, definitions: Any) -> dict[str, int]:
        if not isinstance(definitions, dict):
            raise ApiError(400, "definitions must be a JSON object")
        self.request("POST", "/definitions", definitions)
        return {k: len(v) for k, v in definitions.items() if isinstance(v, list)}


def _tags(tags: Any) -> list[str]:
    """RabbitMQ before 3.9 sent tags as "a,b"; later versions and Leveret as a list."""
    if isinstance(tags, str):
        return [t for t in tags.split(",") if t]
    return list(tags)


#: RabbitMQ's `[kind, name]` reasons (a definitions import's missing vhost or user) as
#: the sentence the ctl socket gives
PAIR_REASONS = {
    "no_such_vhost": "vhost '{}' does not exist",
    "no_such_user": "user '{}' does not exist",
}


def _reason(body: bytes, fallback: str) -> str:
    try:
        reason = json.loads(body).get("reason", fallback)
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace").strip() or str(fallback)
    if isinstance(reason, list) and len(reason) == 2 and reason[0] in PAIR_REASONS:
        return PAIR_REASONS[reason[0]].format(reason[1])
    return reason if isinstance(reason, str) else json.dumps(reason)
