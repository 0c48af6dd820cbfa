"""Overview, identity, definitions and health checks."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from aiohttp import web

import leveret
from leveret.broker import definitions_json
from leveret.broker.errors import NotFound
from leveret.broker.exchanges import EXCHANGE_TYPES
from leveret.management.app import read_json
from leveret.management.routes.common import (
    NODE,
    RABBITMQ_VERSION,
    _broker,
    _ok,
    _require_admin,
    _server,
    _vhost,
    _visible_vhosts,
    bad_request,
    listing,
    vhosts_message_stats,
)
from leveret.server.alarms import resident_bytes


async def overview(request: web.Request) -> web.Response:
    server = _server(request)
    vhosts = _visible_vhosts(request)
    connections = [c for c in server.broker.connections if c.vhost in vhosts]
    # One pass over every queue: with 10,000 queues this is most of the call's time.
    n_queues = ready = unacked = consumers = 0
    ready_rate = unacked_rate = 0.0
    for v in vhosts:
        n_queues += len(v.queues)
        for q in v.queues.values():
            ready += q.message_count
            unacked += q.unacked
            consumers += q.consumer_count
            rates = q.stats.depth_rates
            ready_rate += rates[0]
            unacked_rate += rates[1]
    return web.json_response(
        {
            "rates_mode": "basic",
            "statistics_db_event_queue": 0,
            "exchange_types": _exchange_types(),
            "message_stats": vhosts_message_stats(request, vhosts),
            "management_version": RABBITMQ_VERSION,
            "rabbitmq_version": RABBITMQ_VERSION,
            "product_name": "Leveret",
            "product_version": leveret.__version__,
            "cluster_name": "leveret",
            "node": "leveret@localhost",
            "object_totals": {
                "connections": len(connections),
                "channels": sum(len(c.channels) for c in connections),
                "exchanges": sum(len(v.exchanges) for v in vhosts),
                "queues": n_queues,
                "consumers": consumers,
            },
            "queue_totals": {
                "messages": ready + unacked,
                "messages_ready": ready,
                "messages_unacknowledged": unacked,
                "messages_details": {"rate": round(ready_rate + unacked_rate, 1)},
                "messages_ready_details": {"rate": round(ready_rate, 1)},
                "messages_unacknowledged_details": {"rate": round(unacked_rate, 1)},
            },
            "listeners": _listeners(server),
        }
    )


def _listeners(server: Any) -> list[dict[str, Any]]:
    out = [
        {"node": NODE, "protocol": "amqp", "ip_address": h, "port": p} for h, p in server.addresses
    ]
    if server.management is not None:
        out.append(
            {
                "node": NODE,
                "protocol": "http",
                "ip_address": server.config.host,
                "port": server.management.port,
            }
        )
    return out


def _exchange_types() -> list[dict[str, Any]]:
    return [{"name": name, "description": "", "enabled": True} for name in sorted(EXCHANGE_TYPES)]


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _node_json(server: Any) -> dict[str, Any]:
    alarms = server.alarms
    active = alarms.active if alarms is not None else set()
    disk_free = 0
    try:
        st = os.statvfs(server.config.data_dir or ".")
        disk_free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    return {
        "name": NODE,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.monotonic() - server.started_at) * 1000),
        "processors": os.cpu_count() or 1,
        "mem_used": resident_bytes(),
        "mem_limit": alarms.memory_limit if alarms is not None else 0,
        "mem_alarm": "memory" in active,
        "disk_free": disk_free,
        "disk_free_limit": alarms.disk_free_limit if alarms is not None else 0,
        "disk_free_alarm": "disk" in active,
        "fd_used": _open_fds(),
        "fd_total": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "sockets_used": len(server.connections),
        "proc_used": len(server.connections),
        "rates_mode": "basic",
        "exchange_types": _exchange_types(),
        "partitions": [],
        "applications": [
            {"name": "leveret", "description": "Leveret", "version": leveret.__version__}
        ],
    }


async def list_nodes(request: web.Request) -> web.Response:
    return listing(request, [_node_json(_server(request))])


async def get_node(request: web.Request) -> web.Response:
    if request.match_info["node"] != NODE:
        raise NotFound(request.match_info["node"])
    return web.json_response(_node_json(_server(request)))


async def extensions(request: web.Request) -> web.Response:
    return web.json_response([])  # no UI plug-ins: the web UI is one page of its own


async def port_listener(request: web.Request) -> web.Response:
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise bad_request("bad_request", "Invalid port") from None
    server = _server(request)
    ports = sorted({listener["port"] for listener in _listeners(server)})
    if port in ports:
        return web.json_response({"status": "ok", "port": port})
    return web.json_response(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports},
        status=503,
    )


async def whoami(request: web.Request) -> web.Response:
    user = request["user"]
    return web.json_response({"name": user.name, "tags": list(user.tags)})


async def get_definitions(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = request.match_info.get("vhost")
    return web.json_response(definitions_json.export_definitions(_broker(request), vhost))


async def post_definitions(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    vhost = request.match_info.get("vhost")
    definitions_json.import_definitions(_broker(request), body, vhost)
    return _ok()


async def alarms(request: web.Request) -> web.Response:
    server = _server(request)
    if server.alarms is not None and server.alarms.blocking:
        return web.json_response(
            {"status": "failed", "reason": f"resource alarm in effect: {server.alarms.reason}"},
            status=503,
        )
    return web.json_response({"status": "ok"})


async def virtual_hosts_health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def aliveness(request: web.Request) -> web.Response:
    """RabbitMQ declares a queue and publishes to it; the model is in this process, so
    a vhost that exists and answers here is alive."""
    _vhost(request)
    return web.json_response({"status": "ok"})


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/definitions", get_definitions)
    r.add_post("/api/definitions", post_definitions)
    r.add_get("/api/definitions/{vhost}", get_definitions)
    r.add_post("/api/definitions/{vhost}", post_definitions)
    r.add_get("/api/nodes", list_nodes)
    r.add_get("/api/nodes/{node}", get_node)
    r.add_get("/api/extensions", extensions)
    r.add_get("/api/health/checks/port-listener/{port}", port_listener)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", alarms)
    r.add_get("/api/health/checks/virtual-hosts", virtual_hosts_health)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
