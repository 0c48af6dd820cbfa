"""Connections, channels and consumers: what is open right now."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker import definitions_json
from leveret.broker.errors import NotFound
from leveret.broker.stats import connection_counts, message_stats_json
from leveret.management.app import Denied
from leveret.management.routes.common import (
    NODE,
    _broker,
    _ok,
    _require_admin,
    _vhost,
    _visible_vhosts,
    listing,
)


def _peer(conn: Any) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    return host.strip("[]"), int(port or 0)


def _connection_json(conn: Any) -> dict[str, Any]:
    props = conn.client_properties or {}
    host, port = _peer(conn)
    local_host, _, local_port = conn.name.rpartition(" -> ")[2].rpartition(":")
    ssl = conn.peer_cn is not None or conn.transport.get_extra_info("sslcontext") is not None
    recv_rate, send_rate = conn.octet_rates
    out = {
        "name": conn.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user,
        "channels": len(conn.channels),
        "state": "running",
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": getattr(conn, "auth_mechanism", "PLAIN"),
        "host": local_host.strip("[]"),
        "port": int(local_port or 0),
        "peer_host": host,
        "peer_port": port,
        "connected_at": int(conn.connected_at * 1000),
        "timeout": conn.heartbeat,
        "frame_max": conn.frame_max,
        "client_properties": definitions_json._jsonable(props),
        "ssl": ssl,
        "recv_oct": conn.recv_oct,
        "recv_oct_details": {"rate": round(recv_rate, 1)},
        "send_oct": conn.send_oct,
        "send_oct_details": {"rate": round(send_rate, 1)},
        "node": NODE,
    }
    # Leveret also gives a connection the message counts of its channels.
    message_stats = message_stats_json(connection_counts(conn), conn.stats_rates)
    if message_stats:
        out["message_stats"] = message_stats
    return out


def _visible_connections(request: web.Request) -> list[Any]:
    """Open connections in the vhosts the user sees; a plain management user sees its own."""
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    user = request["user"]
    conns = [c for c in _broker(request).connections if c.vhost in vhosts]
    if not {"administrator", "monitoring"} & set(user.tags):
        conns = [c for c in conns if c.user == user.name]
    return sorted(conns, key=lambda c: c.name)


async def list_connections(request: web.Request) -> web.Response:
    return listing(request, _visible_connections(request), _connection_json)


def _connection(request: web.Request) -> Any:
    name = request.match_info["name"]
    for conn in _broker(request).connections:
        if conn.name == name:
            return conn
    raise NotFound(name)


def _visible_connection(request: web.Request) -> Any:
    conn = _connection(request)
    user = request["user"]
    if conn.user != user.name and not {"administrator", "monitoring"} & set(user.tags):
        raise NotFound(conn.name)
    return conn


async def get_connection(request: web.Request) -> web.Response:
    return web.json_response(_connection_json(_visible_connection(request)))


async def delete_connection(request: web.Request) -> web.Response:
    conn = _connection(request)
    user = request["user"]
    if conn.user != user.name and "administrator" not in user.tags:
        raise NotFound(conn.name)
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    conn.force_close(text=f"CONNECTION_FORCED - {reason}")
    return _ok()


def _user_connections(request: web.Request) -> list[Any]:
    """A user's connections, for that user itself, monitoring or administrator users."""
    name, user = request.match_info["user"], request["user"]
    if name != user.name and not {"administrator", "monitoring"} & set(user.tags):
        raise Denied("Not administrator user")
    return sorted(_broker(request).connections_of(user=name), key=lambda c: c.name)


async def user_connections(request: web.Request) -> web.Response:
    """RabbitMQ lists these from its connection tracking: name, node, user, vhost only."""
    return web.json_response(
        [
            {
                "name": c.name,
                "node": NODE,
                "user": c.user,
                "vhost": c.vhost.name if c.vhost else None,
            }
            for c in _user_connections(request)
        ]
    )


async def close_user_connections(request: web.Request) -> web.Response:
    if request["user"].name != request.match_info["user"]:
        _require_admin(request)
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    for conn in _user_connections(request):
        conn.force_close(text=f"CONNECTION_FORCED - {reason}")
    return _ok()


# --- channels and consumers ----------------------------------------------------------------


def _channel_name(channel: Any) -> str:
    return f"{channel.conn.name} ({channel.number})"


def _channel_details(channel: Any) -> dict[str, Any]:
    host, port = _peer(channel.conn)
    return {
        "name": _channel_name(channel),
        "number": channel.number,
        "connection_name": channel.conn.name,
        "peer_host": host,
        "peer_port": port,
        "user": channel.conn.user,
        "node": NODE,
    }


def _channel_json(channel: Any) -> dict[str, Any]:
    conn = channel.conn
    host, port = _peer(conn)
    waiting = sum(1 for state in channel.confirm_waiting.values() if state is None)
    out = {
        "name": _channel_name(channel),
        "number": channel.number,
        "node": NODE,
        "vhost": channel.vhost.name,
        "user": conn.user,
        "connection_details": {"name": conn.name, "peer_host": host, "peer_port": port},
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": channel.unacked_count,
        "messages_unconfirmed": waiting,
        "messages_uncommitted": len(channel.tx.publishes) if channel.tx is not None else 0,
        "acks_uncommitted": len(channel.tx.settlements) if channel.tx is not None else 0,
        "prefetch_count": channel.prefetch_count,
        "global_prefetch_count": channel.global_prefetch,
        "confirm": channel.confirm_mode,
        "transactional": channel.tx is not None,
        "state": "closing"
        if channel.closing
        else ("flow" if not channel.flow_active else "running"),
    }
    message_stats = channel.stats.to_json()
    if message_stats:
        out["message_stats"] = message_stats
    return out


def _channels(request: web.Request) -> list[Any]:
    return [ch for c in _visible_connections(request) for ch in c.channels.values()]


async def list_channels(request: web.Request) -> web.Response:
    return listing(request, [_channel_json(ch) for ch in _channels(request)])


async def connection_channels(request: web.Request) -> web.Response:
    conn = _visible_connection(request)
    return listing(request, [_channel_json(ch) for ch in conn.channels.values()])


async def get_channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for channel in _channels(request):
        if _channel_name(channel) == name:
            return web.json_response(_channel_json(channel))
    raise NotFound(name)


def _consumer_json(consumer: Any) -> dict[str, Any]:
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
        "channel_details": _channel_details(consumer.channel),
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "arguments": definitions_json._jsonable(consumer.arguments or {}),
        "active": True,
        "activity_status": "up",
    }


async def list_consumers(request: web.Request) -> web.Response:
    consumers = [c for ch in _channels(request) for c in ch.consumers.values()]
    return listing(request, [_consumer_json(c) for c in consumers])


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/channels", list_channels)
    r.add_get("/api/vhosts/{vhost}/channels", list_channels)
    r.add_get("/api/channels/{name}", get_channel)
    r.add_get("/api/connections/{name}/channels", connection_channels)
    r.add_get("/api/consumers", list_consumers)
    r.add_get("/api/consumers/{vhost}", list_consumers)
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/vhosts/{vhost}/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", delete_connection)
    r.add_get("/api/connections/username/{user}", user_connections)
    r.add_delete("/api/connections/username/{user}", close_user_connections)
