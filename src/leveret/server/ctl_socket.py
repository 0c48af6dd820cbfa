"""The operator's control socket: `leveret ctl` talks to the running broker here.

A Unix socket at <data_dir>/ctl.sock, mode 0600: only the account that runs
the broker (and root) can connect, so the file system does the
authentication, as the Erlang cookie file does for rabbitmqctl. No password
travels, nothing listens on the network, and it works before any user exists
(a lost administrator password can be reset). The management HTTP API is the
remote interface; this is the local one.

Wire format: one JSON object per line each way. Request
{"op": "add_user", "args": {...}}; reply {"ok": result} or
{"error": "not_found" | "already_exists" | "invalid" | ..., "message": text}.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from leveret.broker import definitions_json, inventory
from leveret.broker.errors import (
    AccessRefused,
    AlreadyExists,
    InvalidValue,
    LimitReached,
    ModelError,
    NotFound,
)
from leveret.broker.global_parameters import CLUSTER_NAME
from leveret.server.unix_path import short_path

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

log = logging.getLogger("leveret.ctl")

SOCKET_NAME = "ctl.sock"
MAX_REQUEST = 64 * 1024 * 1024  # a definitions import can be large

ERROR_KINDS: dict[type[ModelError], str] = {
    NotFound: "not_found",
    AlreadyExists: "already_exists",
    InvalidValue: "invalid",
    AccessRefused: "access_refused",
    LimitReached: "limit_reached",
}

# Admin operations callable as they are, with keyword arguments.
ADMIN_OPERATIONS = (
    "add_vhost",
    "delete_vhost",
    "list_vhosts",
    "set_vhost_limits",
    "clear_vhost_limits",
    "add_user",
    "delete_user",
    "change_password",
    "clear_password",
    "set_user_tags",
    "authenticate_user",
    "list_users",
    "set_user_limits",
    "clear_user_limits",
    "list_user_limits",
    "set_permissions",
    "clear_permissions",
    "list_permissions",
    "set_topic_permissions",
    "clear_topic_permissions",
    "list_topic_permissions",
    "set_policy",
    "clear_policy",
    "list_policies",
    "set_operator_policy",
    "clear_operator_policy",
    "list_operator_policies",
)


def _vhost_view(view: Callable[[Any], list]) -> Callable[..., list]:
    def run(broker: Broker, vhost: str = "/") -> list:
        return view(broker.admin.vhost(vhost))

    return run


OTHER_OPERATIONS: dict[str, Callable[..., Any]] = {
    "list_queues": _vhost_view(inventory.queues),
    "list_exchanges": _vhost_view(inventory.exchanges),
    "list_bindings": _vhost_view(inventory.bindings),
    "list_connections": lambda broker, vhost=None: inventory.connections(broker, vhost),
    "list_mqtt_connections": lambda broker: [
        c.info() for c in (broker.mqtt.open_connections() if broker.mqtt is not None else [])
    ],
    # Runtime parameters and the links that act on them (leveret.links).
    "set_parameter": lambda broker, vhost, component, name, value: (
        broker.parameters.set(vhost, component, name, value) and None
    ),
    "clear_parameter": lambda broker, vhost, component, name: broker.parameters.clear(
        vhost, component, name
    ),
    "list_parameters": lambda broker, vhost="/": [
        {"component": p["component"], "name": p["name"], "value": p["value"]}
        for p in broker.parameters.list(broker.admin.vhost(vhost).name)
    ],
    # Global runtime parameters; the cluster name is the one called cluster_name.
    "set_cluster_name": lambda broker, name: _set_global(broker, CLUSTER_NAME, name),
    "set_global_parameter": lambda broker, name, value: _set_global(broker, name, value),
    "clear_global_parameter": lambda broker, name: broker.global_parameters.clear(name),
    "list_global_parameters": lambda broker: broker.global_parameters.list(),
    "shovel_status": lambda broker: _links(broker).shovel_status(),
    "restart_shovel": lambda broker, vhost, name: _links(broker).restart_shovel_now(vhost, name),
    "delete_shovel": lambda broker, vhost, name: _links(broker).delete_shovel(vhost, name),
    "federation_status": lambda broker: _links(broker).federation.status(),
    "export_definitions": definitions_json.export_definitions,
    "import_definitions": lambda broker, definitions, vhost=None: (
        definitions_json.import_definitions(broker, definitions, vhost)
    ),
}


def _set_global(broker: Broker, name: str, value: Any) -> None:
    broker.global_parameters.set(name, value)


def _links(broker: Broker) -> Any:
    links = broker.links
    if links is None:
        raise InvalidValue("shovels and federation are not running in this broker")
    return links


def run_operation(broker: Broker, op: str, args: dict[str, Any]) -> Any:
    """Run one named operation; ModelError and TypeError (bad arguments) propagate."""
    if op in ADMIN_OPERATIONS:
        return getattr(broker.admin, op)(**args)
    if op in OTHER_OPERATIONS:
        return OTHER_OPERATIONS[op](broker, **args)
    raise InvalidValue(f"unknown operation '{op}'")


class ControlSocket:
    def __init__(
        self,
        broker_source: Callable[[], Broker],
        path: str,
        ready: Callable[[], Awaitable[None]] | None = None,
        operations: dict[str, Callable[..., Any]] | None = None,
    ) -> None:
        self._broker = broker_source  # the server may replace its broker at start
        self._ready = ready  # awaited before each operation: the broker's recovery
        # Listings that replace OTHER_OPERATIONS' (any worker of several lists every
        # worker's queues, connections and MQTT connections).
        self._operations = operations or {}
        self.path = path
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> bool:
        """Listen; False (and a log line) when the socket cannot be made."""
        try:
            with short_path(self.path) as path:  # a data dir may be deep (unix_path.py)
                if os.path.exists(path):
                    os.unlink(path)  # left by a broker that was killed
                # Bound here, with no await between setting the umask and restoring
                # it: the umask is the process's, and another node of the same
                # process (in-process workers) may start its socket meanwhile.
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    old_umask = os.umask(0o177)
                    try:
                        sock.bind(path)
                    finally:
                        os.umask(old_umask)
                    os.chmod(path, 0o600)
                    self._server = await asyncio.start_unix_server(
                        self._serve, sock=sock, limit=MAX_REQUEST
                    )
                except BaseException:
                    sock.close()
                    raise
        except OSError as exc:
            log.warning("leveret ctl is unavailable: cannot listen on %s: %s", self.path, exc)
            return False
        log.info("control socket for leveret ctl at %s", self.path)
        return True

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            try:
                with short_path(self.path) as path:
                    os.unlink(path)
            except OSError:
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if self._ready is not None:
                await self._ready()
            reply = self._handle(line)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            log.info("control socket client went away: %s", exc)
        finally:
            writer.close()

    def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op, args = request["op"], request.get("args") or {}
            if not isinstance(op, str) or not isinstance(args, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return {"error": "invalid", "message": "malformed request to the control socket"}
        try:
            override = self._operations.get(op)
            if override is not None:
                result = override(self._broker(), **args)
            else:
                result = run_operation(self._broker(), op, args)
        except ModelError as exc:
            kind = next((k for t, k in ERROR_KINDS.items() if isinstance(exc, t)), "error")
            return {"error": kind, "message": str(exc)}
        except TypeError as exc:
            return {"error": "invalid", "message": f"bad arguments for {op}: {exc}"}
        except Exception:
            log.exception("control operation %s failed", op)
            return {"error": "internal", "message": "internal error; see the broker log"}
        if op not in ("list_vhosts",) and not op.startswith(("list_", "export", "authenticate")):
            log.info("ctl: %s %s", op, {k: v for k, v in args.items() if k != "password"})
        return {"ok": _plain(result)}


def _plain(result: Any) -> Any:
    """Model objects become their records; JSON-ready values pass through."""
    if hasattr(result, "record"):
        return result.record()
    if hasattr(result, "name") and not isinstance(result, dict | str):
        return {"name": result.name}
    return result
