"""The /api routes: RabbitMQ 3.10's paths, methods, status codes and field names."""

from __future__ import annotations

from typing import Any

from aiohttp import web

import leveret
from leveret.broker import definitions_json
from leveret.broker.errors import InvalidValue, NotFound
from leveret.management.app import SERVER_KEY, Denied, read_json

RABBITMQ_VERSION = "3.10.8"  # the API version Leveret follows


def _server(request: web.Request) -> Any:
    return request.app[SERVER_KEY]


def _broker(request: web.Request) -> Any:
    return _server(request).broker


def _admin(request: web.Request) -> Any:
    return _broker(request).admin


def _require_admin(request: web.Request) -> None:
    if "administrator" not in request["user"].tags:
        raise Denied("Not administrator user")


def _visible_vhosts(request: web.Request) -> list[Any]:
    """Administrators and monitoring users see every vhost; others those they may use."""
    broker = _broker(request)
    user = request["user"]
    vhosts = sorted(broker.vhosts.values(), key=lambda v: v.name)
    if {"administrator", "monitoring"} & set(user.tags):
        return vhosts
    return [v for v in vhosts if broker.access.permission(user.name, v.name) is not None]


def _vhost(request: web.Request) -> Any:
    name = request.match_info["vhost"]
    for vhost in _visible_vhosts(request):
        if vhost.name == name:
            return vhost
    raise NotFound(name)


def _ok(status: int = 204) -> web.Response:
    return web.Response(status=status)


# --- overview and identity ---------------------------------------------------------------


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


# --- vhosts ------------------------------------------------------------------------------


def _vhost_json(vhost: Any) -> dict[str, Any]:
    ready = sum(q.message_count for q in vhost.queues.values())
    unacked = sum(q.unacked for q in vhost.queues.values())
    return {
        "name": vhost.name,
        "description": vhost.description,
        "tags": vhost.tags,
        "metadata": {"description": vhost.description, "tags": vhost.tags},
        "tracing": False,
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


async def list_vhosts(request: web.Request) -> web.Response:
    return web.json_response([_vhost_json(v) for v in _visible_vhosts(request)])


async def get_vhost(request: web.Request) -> web.Response:
    return web.json_response(_vhost_json(_vhost(request)))


async def put_vhost(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidValue("the body must be a JSON object")
    name = request.match_info["vhost"]
    existed = name in _broker(request).vhosts
    tags = body.get("tags", [])
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    _admin(request).add_vhost(name, body.get("description", ""), tags, exist_ok=True)
    return _ok(204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).delete_vhost(request.match_info["vhost"])
    return _ok()


# --- users -------------------------------------------------------------------------------


def _user_json(user: Any) -> dict[str, Any]:
    return {**user.record(), "limits": {}}


async def list_users(request: web.Request) -> web.Response:
    _require_admin(request)
    users = sorted(_broker(request).access.users.values(), key=lambda u: u.name)
    return web.json_response([_user_json(u) for u in users])


async def get_user(request: web.Request) -> web.Response:
    _require_admin(request)
    return web.json_response(_user_json(_admin(request).user(request.match_info["user"])))


async def put_user(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidValue("the body must be a JSON object")
    name = request.match_info["user"]
    existed = name in _broker(request).access.users
    tags = body.get("tags", [])
    if "password" in body:
        _admin(request).add_user(name, body["password"], tags, replace=True)
    elif "password_hash" in body:
        _admin(request).add_user(
            name,
            None,
            tags,
            password_hash=body["password_hash"],
            hashing_algorithm=body.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
            replace=True,
        )
    elif existed:
        _admin(request).set_user_tags(name, tags)
    else:
        raise InvalidValue("password or password_hash must be set")
    return _ok(204 if existed else 201)


async def delete_user(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).delete_user(request.match_info["user"])
    return _ok()


# --- permissions -----------------------------------------------------------------------------


async def list_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return web.json_response(_admin(request).list_permissions())


async def vhost_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return web.json_response(_admin(request).list_permissions(vhost=_vhost(request).name))


async def user_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return web.json_response(_admin(request).list_permissions(user=request.match_info["user"]))


async def get_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    perm = _broker(request).access.permission(user, vhost)
    if perm is None:
        raise NotFound(user)
    return web.json_response(perm.record())


async def put_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    broker = _broker(request)
    if vhost not in broker.vhosts or user not in broker.access.users:
        raise InvalidValue("vhost_or_user_not_found")
    if not isinstance(body, dict):
        raise InvalidValue("the body must be a JSON object")
    existed = broker.access.permission(user, vhost) is not None
    _admin(request).set_permissions(
        user, vhost, body.get("configure", ""), body.get("write", ""), body.get("read", "")
    )
    return _ok(204 if existed else 201)


async def delete_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).clear_permissions(request.match_info["user"], request.match_info["vhost"])
    return _ok()


# --- queues and exchanges ----------------------------------------------------------------


def _queue_json(vhost: Any, q: Any) -> dict[str, Any]:
    ready = q.message_count
    return {
        "name": q.name,
        "vhost": vhost.name,
        "type": q.queue_type,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "arguments": definitions_json._jsonable(q.arguments),
        "consumers": q.consumer_count,
        "messages": ready + q.unacked,
        "messages_ready": ready,
        "messages_unacknowledged": q.unacked,
        "node": "leveret@localhost",
        "state": "running",
        **vhost.policy_of("queue", q.name, q.queue_type),
    }


def _exchange_json(vhost: Any, x: Any) -> dict[str, Any]:
    return {
        "name": x.name,
        "vhost": vhost.name,
        "type": x.type_name,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": definitions_json._jsonable(x.arguments),
    }


async def list_queues(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    return web.json_response(
        [_queue_json(v, q) for v in vhosts for q in sorted(v.queues.values(), key=lambda q: q.name)]
    )


async def get_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    return web.json_response(_queue_json(vhost, queue))


async def delete_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    vhost.delete_queue(queue)
    return _ok()


async def purge_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    vhost.purge_queue(queue)
    return _ok()


async def list_exchanges(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    return web.json_response(
        [
            _exchange_json(v, x)
            for v in vhosts
            for x in sorted(v.exchanges.values(), key=lambda x: x.name)
        ]
    )


# --- definitions and health ----------------------------------------------------------------


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


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/vhosts", list_vhosts)
    r.add_get("/api/vhosts/{vhost}", get_vhost)
    r.add_put("/api/vhosts/{vhost}", put_vhost)
    r.add_delete("/api/vhosts/{vhost}", delete_vhost)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/{user}", get_user)
    r.add_put("/api/users/{user}", put_user)
    r.add_delete("/api/users/{user}", delete_user)
    r.add_get("/api/users/{user}/permissions", user_permissions)
    r.add_get("/api/permissions", list_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", get_permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_queues)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_get("/api/exchanges", list_exchanges)
    r.add_get("/api/exchanges/{vhost}", list_exchanges)
    r.add_get("/api/definitions", get_definitions)
    r.add_post("/api/definitions", post_definitions)
    r.add_get("/api/definitions/{vhost}", get_definitions)
    r.add_post("/api/definitions/{vhost}", post_definitions)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", alarms)
    r.add_get("/api/health/checks/virtual-hosts", virtual_hosts_health)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
