"""Connections, channels and consumers: what is open right now."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker import definitions_json
from leveret.broker.errors import NotFound
from leveret.management.routes.common import (
    _broker,
    _ok,
    _vhost,
    _visible_vhosts,
)


def _connection_json(conn: Any) -> dict[str, Any]:
    props = conn.client_properties or {}
    return {
        "name": conn.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user,
        "channels": len(conn.channels),
        "state": "running",
        "peer_host": conn.peer.rpartition(":")[0],
        "peer_port": int(conn.peer.rpartition(":")[2] or 0),
        "client_properties": definitions_json._jsonable(props),
        "ssl": conn.peer_cn is not None or conn.transport.get_extra_info("sslcontext") is not None,
        "node": "leveret@localhost",
    }


async def list_connections(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    user = request["user"]
    broker = _broker(request)
    conns = [c for c in broker.connections if c.vhost in vhosts]
    if not {"administrator", "monitoring"} & set(user.tags):
        conns = [c for c in conns if c.user == user.name]
    return web.json_response([_connection_json(c) for c in sorted(conns, key=lambda c: c.name)])


def _connection(request: web.Request) -> Any:
    name = request.match_info["name"]
    for conn in _broker(request).connections:
        if conn.name == name:
            return conn
    raise NotFound(name)


async def get_connection(request: web.Request) -> web.Response:
    conn = _connection(request)
    user = request["user"]
    if conn.user != user.name and not {"administrator", "monitoring"} & set(user.tags):
        raise NotFound(conn.name)
    return web.json_response(_connection_json(conn))


async def delete_connection(request: web.Request) -> web.Response:
    conn = _connection(request)
    user = request["user"]
    if conn.user != user.name and "administrator" not in user.tags:
        raise NotFound(conn.name)
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    conn.force_close(text=f"CONNECTION_FORCED - {reason}")
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/vhosts/{vhost}/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", delete_connection)
