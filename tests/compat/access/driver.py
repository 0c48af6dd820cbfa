"""Run one access-control case against a broker and write down what it answered.

A case (cases.py) is a setup, made by an operator, and a list of steps: logins,
channel methods and publishes on named connections, and operator actions in
between. The Runner plays the steps over raw AMQP frames (tests/rawamqp.py, which
frames with Leveret's own protocol code) and keeps, for each step, the broker's
answer as plain JSON data:

    {"ok": "queue.declare-ok"}
    {"channel.close": [403, "ACCESS_REFUSED - ...", 50, 10]}
    {"connection.close": [530, "NOT_ALLOWED - ...", 10, 40]}
    {"closed": "socket"}            the socket closed with no close method
    {"timeout": true}               nothing came

The answer of a publish is the answer to a basic.qos sent right behind it: a
broker handles a channel's methods in order, so a refused publish shows as the
channel.close that comes before qos-ok.

The same steps run against RabbitMQ (recording) and against Leveret (replay);
the operator is RabbitMQ's HTTP API or Leveret's Admin, with the same actions.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from pamqp import commands

try:  # under pytest, tests/ is on sys.path; under `python -m tests.compat...`, the repo root
    import rawamqp
except ImportError:  # pragma: no cover - depends on how the recorder is started
    from tests import rawamqp

#: the vhost every case runs in, made before and deleted after it
VHOST = "access"
PASSWORD = "pw-1"
#: server-named queues differ from run to run
_GENERATED = re.compile(r"amq\.gen-[A-Za-z0-9_-]{22}")


#: RabbitMQ closes a deleted vhost's connections with either text, depending on which of
#: its processes stops first (docs/differences.md, "connection closed by deleting its vhost")
_VHOST_DOWN = re.compile(r"(vhost '[^']*') is down")


def normalise(text: str) -> str:
    """A reply text without what changes from run to run."""
    return _VHOST_DOWN.sub(r"\1 is deleted", _GENERATED.sub("amq.gen-*", text))


def method_class(name: str) -> type:
    """`queue.declare` -> pamqp's commands.Queue.Declare."""
    cls, method = name.split(".")
    parts = method.split("-")
    return getattr(getattr(commands, cls.capitalize()), "".join(p.capitalize() for p in parts))


def method_name(obj: Any) -> str:
    """pamqp's `Queue.DeclareOk` -> `queue.declare-ok`."""
    return obj.name.lower().replace("ok", "-ok").replace("getempty", "get-empty")


# --- operators: the same actions on RabbitMQ (HTTP API) and on Leveret (Admin) ----------


class RabbitOperator:
    """Setup through RabbitMQ's management HTTP API, as guest."""

    def __init__(self, management_url: str) -> None:
        self.api = management_url.rstrip("/") + "/api"

    def _call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> None:
        request = urllib.request.Request(
            self.api + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "content-type": "application/json",
                "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            if not (missing_ok and exc.code == 404):
                raise

    def vhost(self, name: str) -> None:
        self._call("PUT", f"/vhosts/{quote(name, safe='')}", {})

    def delete_vhost(self, name: str) -> None:
        self._call("DELETE", f"/vhosts/{quote(name, safe='')}", missing_ok=True)

    def user(self, name: str, password: str | None = PASSWORD, tags: str = "") -> None:
        body: dict[str, Any] = {"tags": tags}
        if password is None:
            body["password_hash"] = ""
        else:
            body["password"] = password
        self._call("PUT", f"/users/{quote(name, safe='')}", body)

    def delete_user(self, name: str) -> None:
        self._call("DELETE", f"/users/{quote(name, safe='')}", missing_ok=True)

    def perm(self, user: str, configure: str, write: str, read: str, vhost: str = VHOST) -> None:
        body = {"configure": configure, "write": write, "read": read}
        self._call("PUT", f"/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}", body)

    def clear_perm(self, user: str, vhost: str = VHOST) -> None:
        self._call("DELETE", f"/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}")

    def topic(self, user: str, exchange: str, write: str, read: str, vhost: str = VHOST) -> None:
        body = {"exchange": exchange, "write": write, "read": read}
        path = f"/topic-permissions/{quote(vhost, safe='')}/{quote(user, safe='')}"
        self._call("PUT", path, body)

    def vhost_limit(self, name: str, value: int, vhost: str = VHOST) -> None:
        path = f"/vhost-limits/{quote(vhost, safe='')}/{name}"
        self._call("PUT", path, {"value": value})

    def user_limit(self, user: str, name: str, value: int) -> None:
        self._call("PUT", f"/user-limits/{quote(user, safe='')}/{name}", {"value": value})


class LeveretOperator:
    """The same actions through Leveret's Admin (as `leveret ctl` runs them)."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin

    def vhost(self, name: str) -> None:
        self.admin.add_vhost(name)

    def delete_vhost(self, name: str) -> None:
        if any(v["name"] == name for v in self.admin.list_vhosts()):
            self.admin.delete_vhost(name)

    def user(self, name: str, password: str | None = PASSWORD, tags: str = "") -> None:
        self.admin.add_user(name, password, tags)

    def delete_user(self, name: str) -> None:
        if any(u["name"] == name for u in self.admin.list_users()):
            self.admin.delete_user(name)

    def perm(self, user: str, configure: str, write: str, read: str, vhost: str = VHOST) -> None:
        self.admin.set_permissions(user, vhost, configure, write, read)

    def clear_perm(self, user: str, vhost: str = VHOST) -> None:
        self.admin.clear_permissions(user, vhost)

    def topic(self, user: str, exchange: str, write: str, read: str, vhost: str = VHOST) -> None:
        self.admin.set_topic_permissions(user, vhost, exchange, write, read)

    def vhost_limit(self, name: str, value: int, vhost: str = VHOST) -> None:
        self.admin.set_vhost_limits(vhost, {name: value})

    def user_limit(self, user: str, name: str, value: int) -> None:
        self.admin.set_user_limits(user, {name: value})


# --- the runner -----------------------------------------------------------------------


class _Conn:
    def __init__(self, client: rawamqp.RawClient) -> None:
        self.client = client
        self.channel = 0  # the channel method steps use; 0: none open
        self.last_channel = 0
        self.open = False


class Runner:
    """Plays a case's steps on one broker; `run` returns the answers, one per step."""

    def __init__(
        self, host: str, port: int, operator: Any, timeout: float = 8.0, api: str | None = None
    ) -> None:
        self.host, self.port = host, port
        self.api = api  # the management API's base URL, for "http" steps
        self.operator = operator
        self.timeout = timeout
        self.conns: dict[str, _Conn] = {}

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        users = [s[1] for s in case["setup"] if s[0] == "user"]
        self._cleanup(users)
        try:
            self.operator.vhost(VHOST)
            self.operator.perm("guest", ".*", ".*", ".*")
            if case.get("objects"):
                self._make_objects(case["objects"])
            for action in case["setup"]:
                getattr(self.operator, action[0])(*action[1:])
            return [self._step(step) for step in case["steps"]]
        finally:
            for conn in self.conns.values():
                conn.client.close()
            self.conns.clear()
            self._cleanup(users)

    def _cleanup(self, users: list[str]) -> None:
        self.operator.delete_vhost(VHOST)
        for user in users:
            self.operator.delete_user(user)

    def _make_objects(self, objects: list[tuple]) -> None:
        """Exchanges, queues and bindings the case needs, declared as guest."""
        with rawamqp.RawClient(self.host, self.port, self.timeout) as admin:
            admin.handshake("guest", "guest", VHOST)
            admin.open_channel(1)
            for name, fields in objects:
                reply = admin.rpc(1, method_class(name)(**fields), _reply_type(name))
                if isinstance(reply, commands.Channel.Close):
                    raise AssertionError(f"setup {name} {fields}: {reply.reply_text}")

    # --- steps

    def _step(self, step: tuple) -> dict[str, Any]:
        kind, conn_id, args = step
        if kind == "op":
            getattr(self.operator, args[0])(*args[1:])
            return {"ok": "op"}
        if kind == "http":
            return self._http(conn_id, **args)
        if kind == "login":
            return self._login(conn_id, **args)
        conn = self.conns[conn_id]
        if kind == "close":
            conn.client.close()
            conn.open = False
            return {"ok": "closed"}
        try:
            if kind == "wait":
                return self._answer(conn)
            if kind == "channel":
                return self._open_channel(conn)
            if not conn.channel:
                answer = self._open_channel(conn)
                if "ok" not in answer:
                    return answer
            if kind == "publish":
                return self._publish(conn, **args)
            name, fields = args
            conn.client.send_method(conn.channel, method_class(name)(**fields))
            return self._answer(conn, _reply_type(name))
        except (rawamqp.ConnectionLost, OSError):
            conn.open = False
            return {"closed": "socket"}

    def _http(
        self, user: str, method: str, path: str, body: Any = None, raw: str | None = None
    ) -> dict[str, Any]:
        """A management API call as `user`: its status and JSON body (hashes masked)."""
        assert self.api is not None, "this case needs the management API"
        data = raw.encode() if raw is not None else None
        if body is not None:
            data = json.dumps(body).encode()
        password = "guest" if user == "guest" else PASSWORD
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = urllib.request.Request(
            self.api.rstrip("/") + path,
            data=data,
            method=method,
            headers={"content-type": "application/json", "authorization": f"Basic {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read()
        return {"status": status, "body": _masked(json.loads(text)) if text else None}

    def _login(
        self,
        conn_id: str,
        user: str,
        password: str = PASSWORD,
        vhost: str = VHOST,
        mechanism: str = "PLAIN",
        capable: bool = True,
        response: str | None = None,
    ) -> dict[str, Any]:
        old = self.conns.pop(conn_id, None)
        if old is not None:
            old.client.close()
        client = rawamqp.RawClient(self.host, self.port, self.timeout)
        conn = self.conns[conn_id] = _Conn(client)
        capabilities: dict[str, Any] = {"publisher_confirms": True, "basic.nack": True}
        if capable:
            capabilities["authentication_failure_close"] = True
        if response is None:
            if mechanism == "AMQPLAIN":
                response = rawamqp.amqplain_response(user, password)
            else:
                response = rawamqp.plain_response(user, password)
        try:
            client.send_protocol_header()
            client.wait_for(commands.Connection.Start)
            client.send_method(
                0,
                commands.Connection.StartOk(
                    client_properties={"product": "compat-access", "capabilities": capabilities},
                    mechanism=mechanism,
                    response=response,
                ),
            )
            reply = self._next(conn, commands.Connection.Tune)
            if not isinstance(reply, commands.Connection.Tune):
                return reply
            client.send_method(
                0,
                commands.Connection.TuneOk(
                    channel_max=reply.channel_max, frame_max=reply.frame_max, heartbeat=0
                ),
            )
            client.send_method(0, commands.Connection.Open(virtual_host=vhost))
            answer = self._answer(conn, commands.Connection.OpenOk)
            conn.open = "ok" in answer
            client.opened = conn.open
            return answer
        except rawamqp.ConnectionLost:
            return {"closed": "socket"}

    def _open_channel(self, conn: _Conn) -> dict[str, Any]:
        conn.last_channel += 1
        conn.channel = conn.last_channel
        conn.client.send_method(conn.channel, commands.Channel.Open())
        return self._answer(conn, commands.Channel.OpenOk)

    def _publish(
        self,
        conn: _Conn,
        exchange: str,
        routing_key: str,
        mandatory: bool = False,
        **properties: Any,
    ) -> dict[str, Any]:
        props = commands.Basic.Properties(**properties)
        conn.client.publish(conn.channel, exchange, routing_key, b"m", props, mandatory)
        conn.client.send_method(conn.channel, commands.Basic.Qos(prefetch_count=0))
        return self._answer(conn, commands.Basic.QosOk)

    def _answer(self, conn: _Conn, *ok_types: type) -> dict[str, Any]:
        reply = self._next(conn, *ok_types)
        if isinstance(reply, dict):
            return reply
        return {"ok": method_name(reply)}

    def _next(self, conn: _Conn, *ok_types: type) -> Any:
        """The next answer that matters: an ok of `ok_types`, or a close (turned into data)."""
        client = conn.client
        while True:
            try:
                channel, frame = client.read_frame()
            except rawamqp.Timeout:
                return {"timeout": True}
            except rawamqp.ConnectionLost:
                conn.open = False
                return {"closed": "socket"}
            if isinstance(frame, commands.Connection.Close):
                conn.open = False
                try:
                    client.send_method(0, commands.Connection.CloseOk())
                except OSError:
                    pass
                client.opened = False
                return {"connection.close": _close_data(frame)}
            if isinstance(frame, commands.Channel.Close):
                client.send_method(channel, commands.Channel.CloseOk())
                if channel == conn.channel:
                    conn.channel = 0  # the next method step opens a fresh channel
                return {"channel.close": _close_data(frame)}
            if isinstance(frame, ok_types):
                return frame


def _masked(value: Any) -> Any:
    """Password hashes are salted: the same password hashes differently every time."""
    if isinstance(value, dict):
        return {k: "*" if k == "password_hash" else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _close_data(frame: Any) -> list[Any]:
    return [frame.reply_code, normalise(frame.reply_text), frame.class_id, frame.method_id]


def _reply_type(name: str) -> tuple[type, ...]:
    if name == "basic.get":
        return (commands.Basic.GetOk, commands.Basic.GetEmpty)
    return (method_class(name + "-ok"),)
