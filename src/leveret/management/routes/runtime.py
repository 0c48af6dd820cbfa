"""Connections, channels and consumers: what is open right now."""

from __future__ import annotations

import contextlib
import time
from functools import partial
from typing import Any

from aiohttp import web

from leveret.broker import definitions_json
from leveret.broker.errors import NotFound
from leveret.management.app import Denied, error
from leveret.management.routes.common import (
    NODE,
    _broker,
    _ok,
    _vhost,
    _visible_vhosts,
    is_admin,
    is_monitor,
    listing,
    worker_stats,
)

# Erlang process figures RabbitMQ adds to connections, channels and queues. Leveret's
# objects are not processes: these documented stand-ins keep the keys and their types
# (docs/management.md#stand-ins).
GARBAGE_COLLECTION = {
    "fullsweep_after": 0,
    "max_heap_size": 0,
    "min_bin_vheap_size": 0,
    "min_heap_size": 0,
    "minor_gcs": 0,
}


def process_stand_ins() -> dict[str, Any]:
    return {
        "garbage_collection": dict(GARBAGE_COLLECTION),
        "reductions": 0,
        "reductions_details": {"rate": 0.0},
    }


def idle_since(at: float) -> str:
    """RabbitMQ's idle_since format: local time, "2024-05-01 12:00:00"."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _peer(conn: Any) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    return host.strip("[]"), int(port or 0)


def _direct_connection_json(conn: Any, props: dict[str, Any]) -> dict[str, Any]:
    """An in-memory connection of a shovel or federation link, as RabbitMQ shows its
    direct (in-VM Erlang client) ones: no socket, so no network fields."""
    name = props.get("connection_name")
    return {
        "client_properties": {"connection_name": name} if isinstance(name, str) else {},
        "connected_at": int(conn.connected_at * 1000),
        "name": conn.name,
        "node": NODE,
        "protocol": "Direct 0-9-1",
        "type": "direct",
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
    }


def _mqtt_connection_json(conn: Any) -> dict[str, Any]:
    """An MQTT connection (leveret.mqtt) as RabbitMQ's MQTT plugin shows one: its
    protocol ("MQTT 3.1.1", "MQTT 5-0") and client id, type "direct"."""
    host, port = _peer(conn)
    local_host, _, local_port = conn.transport.local.rpartition(":")
    return {
        "name": conn.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "channels": 1,
        "channel_max": 1,
        "frame_max": 0,
        "state": "running",
        "type": "direct",
        "protocol": conn.protocol_name,
        "host": local_host.strip("[]"),
        "port": int(local_port) if local_port.isdigit() else 0,
        "peer_host": host,
        "peer_port": port,
        "connected_at": int(conn.connected_at * 1000),
        "client_properties": dict(conn.client_properties),
        "variable_map": {"client_id": conn.client_id},
        "ssl": conn.transport.kind == "tls",
        "recv_oct": conn.recv_oct,
        "recv_oct_details": {"rate": 0.0},
        "recv_cnt": conn.received,
        "send_oct": conn.send_oct,
        "send_oct_details": {"rate": 0.0},
        "send_cnt": conn.sent,
        "send_pend": 0,
        "node": NODE,
        **process_stand_ins(),
    }


def _all_connections(request: web.Request) -> list[Any]:
    """AMQP connections and, when the broker serves MQTT, MQTT ones; with several
    workers, the other workers' too (management/workers.py's RemoteConnection)."""
    broker = _broker(request)
    conns = list(broker.connections)
    if broker.mqtt is not None:
        conns += broker.mqtt.open_connections()
    stats = worker_stats(request)
    if stats is not None:
        conns += stats.connections()
    return conns


def _worker_connection_json(index: int, conn: Any, single: bool = False) -> dict[str, Any]:
    """A connection of a broker of several workers, with its worker's index."""
    if hasattr(conn, "report"):  # another worker's, as that worker built it
        return conn.json(single)
    return {**_connection_json(conn, single), "worker": index}


def _connection_json(conn: Any, single: bool = False) -> dict[str, Any]:
    """RabbitMQ's fields; `single` (GET of one connection) gives "" where a list gives
    null for the TLS fields of a plain connection, as RabbitMQ does."""
    if hasattr(conn, "protocol_name"):
        return _mqtt_connection_json(conn)
    props = conn.client_properties or {}
    if getattr(conn, "direct", None):
        return _direct_connection_json(conn, props)
    host, port = _peer(conn)
    local_host, _, local_port = conn.name.rpartition(" -> ")[2].rpartition(":")
    ssl_object = conn.transport.get_extra_info("ssl_object") if conn.transport else None
    ssl = conn.peer_cn is not None or ssl_object is not None
    recv_rate, send_rate = conn.octet_rates
    blank = "" if single else None
    cipher = ssl_object.cipher() if ssl_object is not None else None
    user_name = props.get("connection_name")
    out = {
        "name": conn.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "channels": len(conn.channels),
        "channel_max": conn.channel_max,
        "state": "running",
        "type": "direct" if getattr(conn, "direct", None) is not None else "network",
        "protocol": "AMQP 0-9-1",
        # RabbitMQ lists the name a client gave (`connection_name`), and nothing without one
        **({"user_provided_name": user_name} if isinstance(user_name, str) else {}),
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
        "ssl_protocol": ssl_object.version() if ssl_object is not None else blank,
        "ssl_cipher": cipher[0] if cipher else blank,
        "ssl_hash": blank if cipher is None else "",
        "ssl_key_exchange": blank if cipher is None else "",
        "peer_cert_subject": conn.peer_cn if conn.peer_cn is not None else blank,
        "peer_cert_issuer": blank,
        "peer_cert_validity": blank,
        "recv_oct": conn.recv_oct,
        "recv_oct_details": {"rate": round(recv_rate, 1)},
        "recv_cnt": conn.recv_cnt,
        "send_oct": conn.send_oct,
        "send_oct_details": {"rate": round(send_rate, 1)},
        "send_cnt": conn.send_cnt,
        "send_pend": conn.transport.get_write_buffer_size() if conn.transport else 0,
        "node": NODE,
        **process_stand_ins(),
    }
    return out


def _visible_connections(request: web.Request) -> list[Any]:
    """Open connections in the vhosts the user sees; a plain management user sees its own."""
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    user = request["user"]
    conns = [c for c in _all_connections(request) if c.vhost in vhosts]
    if not is_monitor(request):
        conns = [c for c in conns if c.user == user.name]
    return sorted(conns, key=lambda c: c.name)


async def list_connections(request: web.Request) -> web.Response:
    # RabbitMQ pages /api/connections, not /api/vhosts/{vhost}/connections.
    paginated = "vhost" not in request.match_info
    stats = worker_stats(request)
    build = _connection_json if stats is None else partial(_worker_connection_json, stats.index)
    return listing(request, _visible_connections(request), build, paginated=paginated)


def _connection(request: web.Request) -> Any:
    name = request.match_info["name"]
    for conn in _all_connections(request):
        if conn.name == name:
            return conn
    raise NotFound(name)


def _own_or(request: web.Request, owner: str | None, allowed: bool) -> None:
    """RabbitMQ's is_authorized_user: monitoring users see (administrators also close)
    other users' connections and channels; everyone their own."""
    if not allowed and owner != request["user"].name:
        raise Denied("User not authorised to access object")


def _visible_connection(request: web.Request) -> Any:
    conn = _connection(request)
    _own_or(request, conn.user, is_monitor(request))
    return conn


async def get_connection(request: web.Request) -> web.Response:
    conn = _visible_connection(request)
    stats = worker_stats(request)
    if stats is not None:
        return web.json_response(_worker_connection_json(stats.index, conn, single=True))
    return web.json_response(_connection_json(conn, single=True))


async def delete_connection(request: web.Request) -> web.Response:
    conn = _connection(request)
    _own_or(request, conn.user, is_admin(request))
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    closing = conn.force_close(text=f"CONNECTION_FORCED - {reason}")
    if closing is not None:  # another worker's: closed there (management/workers.py)
        await closing
    return _ok()


def _user_connections(request: web.Request) -> list[Any]:
    """A user's connections, for that user itself, monitoring or administrator users."""
    name = request.match_info["user"]
    _own_or(request, name, is_admin(request) if request.method == "DELETE" else is_monitor(request))
    conns = _broker(request).connections_of(user=name)
    stats = worker_stats(request)
    if stats is not None:
        conns = [*conns, *(c for c in stats.connections() if c.user == name)]
    return sorted(conns, key=lambda c: c.name)


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
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    for conn in _user_connections(request):
        closing = conn.force_close(text=f"CONNECTION_FORCED - {reason}")
        if closing is not None:  # another worker's
            with contextlib.suppress(NotFound):  # gone already: the others still close
                await closing
    return _ok()


# --- channels and consumers ----------------------------------------------------------------


def _channel_name(channel: Any) -> str:
    return f"{channel.conn.name} ({channel.number})"  # as RemoteChannel.name


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


def _channel_json(channel: Any, single: bool = False) -> dict[str, Any]:
    if hasattr(channel, "report"):  # another worker's (management/workers.py)
        return channel.json(single)
    conn = channel.conn
    host, port = _peer(conn)
    waiting = sum(1 for state in channel.confirm_waiting.values() if state is None)
    out = {
        "name": _channel_name(channel),
        "number": channel.number,
        "node": NODE,
        "vhost": channel.vhost.name,
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "idle_since": idle_since(time.time()),
        "pending_raft_commands": 0,
        **process_stand_ins(),
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
    message_stats = channel.stats.to_json(by_side=True)
    if message_stats:
        out["message_stats"] = message_stats
    if single:
        # A single channel also lists its consumers, and (empty, as RabbitMQ's in
        # "basic" rates mode) its per-exchange publishes and per-queue deliveries.
        out["consumer_details"] = [_consumer_json(c) for c in channel.consumers.values()]
        out["publishes"] = []
        out["deliveries"] = []
    return out


def _channels(request: web.Request) -> list[Any]:
    return [ch for c in _visible_connections(request) for ch in c.channels.values()]


async def list_channels(request: web.Request) -> web.Response:
    if request.query.get("disable_stats") == "true":
        # A channel is nothing but its statistics: RabbitMQ refuses the listing
        return error(400, "bad_request", "Stats in management UI are disabled on this node")
    paginated = "vhost" not in request.match_info  # as RabbitMQ
    return listing(request, [_channel_json(ch) for ch in _channels(request)], paginated=paginated)


async def connection_channels(request: web.Request) -> web.Response:
    conn = _visible_connection(request)
    channels = getattr(conn, "channels", {})  # an MQTT connection has none to show
    return listing(request, [_channel_json(ch) for ch in channels.values()])


async def get_channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    stats = worker_stats(request)
    conns = _broker(request).connections
    if stats is not None:
        conns = [*conns, *stats.connections()]
    for conn in conns:
        for channel in conn.channels.values():
            if _channel_name(channel) == name:
                _own_or(request, conn.user, is_monitor(request))
                return web.json_response(_channel_json(channel, single=True))
    raise NotFound(name)


def _consumer_json(consumer: Any) -> dict[str, Any]:
    if isinstance(consumer, dict):  # another worker's, as it built it
        return consumer
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
        "channel_details": _channel_details(consumer.channel),
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "arguments": definitions_json._jsonable(consumer.arguments or {}),
        **_activity(consumer, queue),
    }


def _activity(consumer: Any, queue: Any) -> dict[str, Any]:
    """RabbitMQ's `active` and `activity_status`: on a single-active-consumer queue, the
    consumer that gets the messages is `single_active` and the others `waiting`."""
    options = getattr(queue, "options", None)
    if not getattr(options, "single_active_consumer", False):
        return {"active": True, "activity_status": "up"}
    active = bool(getattr(consumer, "active", True))
    return {"active": active, "activity_status": "single_active" if active else "waiting"}


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
