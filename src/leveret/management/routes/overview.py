"""Overview, identity, definitions and health checks."""

from __future__ import annotations

from aiohttp import web

import leveret
from leveret.broker import definitions_json
from leveret.management.app import read_json
from leveret.management.routes.common import (
    RABBITMQ_VERSION,
    _broker,
    _ok,
    _require_admin,
    _server,
    _vhost,
    _visible_vhosts,
)


async def overview(request: web.Request) -> web.Response:
    server = _server(request)
    vhosts = _visible_vhosts(request)
    queues = [q for v in vhosts for q in v.queues.values()]
    connections = [c for c in server.broker.connections if c.vhost in vhosts]
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked for q in queues)
    return web.json_response(
        {
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
                "queues": len(queues),
                "consumers": sum(q.consumer_count for q in queues),
            },
            "queue_totals": {
                "messages": ready + unacked,
                "messages_ready": ready,
                "messages_unacknowledged": unacked,
            },
            "listeners": [
                {"node": "leveret@localhost", "protocol": "amqp", "ip_address": h, "port": p}
                for h, p in server.addresses
            ],
        }
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
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", alarms)
    r.add_get("/api/health/checks/virtual-hosts", virtual_hosts_health)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
