"""The /api routes: RabbitMQ 3.10's paths, methods, status codes and field names."""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import quote

from aiohttp import web
from pamqp import commands

import leveret
from leveret.broker import definitions_json
from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.message import Message
from leveret.management.app import SERVER_KEY, Denied, read_json
from leveret.protocol.constants import ACCESS_REFUSED as ACCESS_REFUSED_CODE
from leveret.protocol.constants import NOT_FOUND as NOT_FOUND_CODE
from leveret.protocol.errors import AMQPError
from leveret.protocol.properties import decode_properties, encode_header, parse_header
from leveret.server.authorization import Guard

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
    add_more_routes(app)


# --- more objects: exchanges, queues, bindings, publish/get, connections, policies --------


def _strip_code(text: str) -> str:
    """'PRECONDITION_FAILED - inequivalent ...' → 'inequivalent ...' (RabbitMQ's API form)."""
    return text.partition(" - ")[2] or text


def _body_dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidValue("the body must be a JSON object")
    return body


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise InvalidValue(f"{key} must be true or false")
    return value


def _model_call(fn, *args, **kwargs):
    """Run a model operation that raises AMQP errors; they become 400/404 bodies."""
    try:
        return fn(*args, **kwargs)
    except AMQPError as exc:
        if exc.code == NOT_FOUND_CODE:
            raise NotFound(exc.reply_text) from None
        if exc.code == ACCESS_REFUSED_CODE:
            raise Denied(_strip_code(exc.reply_text)) from None
        raise InvalidValue(_strip_code(exc.reply_text)) from None


def _permission_guard(request: web.Request, vhost: Any) -> Any:
    """The AMQP choke point's Guard for the API user in this vhost (None: full access)."""
    access = _broker(request).access
    user = request["user"].name
    perm, topics = access.permission(user, vhost.name), access.topics(user, vhost.name)
    return Guard(user, vhost, perm, topics) if Guard.needed(perm, topics) else None


async def get_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = vhost.exchanges.get(request.match_info["name"])
    if exchange is None:
        raise NotFound(request.match_info["name"])
    return web.json_response(_exchange_json(vhost, exchange))


async def put_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    if "type" not in body:
        raise InvalidValue("exchange type must be given")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _model_call(guard.require, "configure", "exchange", name)
    existed = name in vhost.exchanges
    _model_call(
        vhost.declare_exchange,
        name,
        body["type"],
        False,
        _bool(body, "durable", True),
        _bool(body, "auto_delete", False),
        _bool(body, "internal", False),
        body.get("arguments") or {},
    )
    return _ok(204 if existed else 201)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    name = request.match_info["name"]
    if name not in vhost.exchanges:
        raise NotFound(name)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _model_call(guard.require, "configure", "exchange", name)
    _model_call(vhost.delete_exchange, name, request.query.get("if-unused") == "true")
    return _ok()


async def put_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _model_call(guard.require, "configure", "queue", name)
    existed = name in vhost.queues
    _model_call(
        vhost.declare_queue,
        name,
        False,
        _bool(body, "durable", True),
        False,
        _bool(body, "auto_delete", False),
        body.get("arguments") or {},
    )
    return _ok(204 if existed else 201)


def _binding_json(vhost: Any, b: Any) -> dict[str, Any]:
    kind = "exchange" if type(b.destination) is type(b.source) else "queue"
    return {
        "source": b.source.name,
        "vhost": vhost.name,
        "destination": b.destination.name,
        "destination_type": kind,
        "routing_key": b.routing_key,
        "arguments": definitions_json._jsonable(b.arguments),
        "properties_key": _properties_key(b.routing_key, b.arguments),
    }


def _properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's name for one binding in a URL: the key, plus a hash of the arguments."""
    if not arguments:
        return quote(routing_key, safe="") if routing_key else "~"
    digest = hashlib.sha1(repr(sorted(arguments.items())).encode()).digest()
    return (
        f"{quote(routing_key, safe='')}~{base64.urlsafe_b64encode(digest[:8]).decode().rstrip('=')}"
    )


def _all_bindings(vhost: Any) -> list[Any]:
    return [
        b
        for x in sorted(vhost.exchanges.values(), key=lambda x: x.name)
        if x.name
        for b in x.bindings.values()
    ]


async def list_bindings(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    return web.json_response([_binding_json(v, b) for v in vhosts for b in _all_bindings(v)])


def _binding_ends(request: web.Request) -> tuple[Any, Any, Any]:
    vhost = _vhost(request)
    source = vhost.exchanges.get(request.match_info["source"])
    kind = request.match_info["kind"]
    name = request.match_info["destination"]
    dest = (vhost.queues if kind == "q" else vhost.exchanges).get(name)
    if source is None or dest is None or kind not in ("q", "e"):
        raise NotFound(name)
    return vhost, source, dest


async def bindings_between(request: web.Request) -> web.Response:
    vhost, source, dest = _binding_ends(request)
    return web.json_response(
        [_binding_json(vhost, b) for b in source.bindings.values() if b.destination is dest]
    )


async def post_binding(request: web.Request) -> web.Response:
    vhost, source, dest = _binding_ends(request)
    body = _body_dict(await read_json(request))
    key = body.get("routing_key", "")
    arguments = body.get("arguments") or {}
    if not isinstance(key, str) or not isinstance(arguments, dict):
        raise InvalidValue("routing_key must be a string and arguments an object")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        kind = "queue" if request.match_info["kind"] == "q" else "exchange"
        _model_call(guard.require, "write", kind, dest.name)
        _model_call(guard._check_source, source.name, key)
    _model_call(vhost.bind, source, dest, key, arguments)
    response = _ok(201)
    response.headers["Location"] = f"{quote(dest.name, safe='')}/{_properties_key(key, arguments)}"
    return response


async def delete_binding(request: web.Request) -> web.Response:
    vhost, source, dest = _binding_ends(request)
    props = request.match_info["props"]
    for b in list(source.bindings.values()):
        if b.destination is dest and _properties_key(b.routing_key, b.arguments) == quote(
            props, safe=""
        ).replace("%7E", "~"):
            _model_call(
                vhost.unbind,
                source.name,
                dest.name,
                request.match_info["kind"] == "q",
                b.routing_key,
                b.arguments,
                None,
            )
            return _ok()
    raise NotFound(props)


async def publish(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    for key in ("routing_key", "payload", "payload_encoding", "properties"):
        if key not in body:
            raise InvalidValue(f"{key} not found")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _model_call(guard.check_publish, name, body["routing_key"])
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise InvalidValue(f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost.name}'")
    payload = body["payload"]
    if body["payload_encoding"] == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (ValueError, TypeError):
            raise InvalidValue("payload is not valid base64") from None
    elif body["payload_encoding"] == "string":
        data = str(payload).encode()
    else:
        raise InvalidValue("payload_encoding must be 'string' or 'base64'")
    props = body["properties"] or {}
    if not isinstance(props, dict):
        raise InvalidValue("properties must be an object")
    try:
        properties = commands.Basic.Properties(**props)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"bad properties: {exc}") from None
    header = encode_header(len(data), properties)
    _cls, _w, _size, flags, delivery_mode = parse_header(header)
    message = Message(name, body["routing_key"], header, data, flags, delivery_mode == 2)
    queues = vhost.route(exchange, message)
    for queue in queues:
        queue.enqueue(message, None)
    return web.json_response({"routed": bool(queues)})


ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


async def get_messages(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    body = _body_dict(await read_json(request))
    count, ackmode = body.get("count", 1), body.get("ackmode")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidValue("count must be a positive integer")
    if ackmode not in ACK_MODES:
        raise InvalidValue("ackmode must be one of " + ", ".join(ACK_MODES))
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _model_call(guard.require, "read", "queue", queue.name)
    if queue.queue_type != "classic":
        raise InvalidValue(f"cannot get from a {queue.queue_type} queue")
    entries = []
    while len(entries) < count:
        entry = queue.get()
        if entry is None:
            break
        queue.unacked += 1
        entries.append(entry)
    out = []
    for i, entry in enumerate(entries):
        message = queue.with_body(entry)
        data = message.body or b""
        try:
            text, encoding = data.decode("utf-8"), "string"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(data).decode(), "base64"
        if body.get("encoding") == "base64":
            text, encoding = base64.b64encode(data).decode(), "base64"
        properties = {
            k: definitions_json._jsonable(v)
            for k, v in dict(decode_properties(message.header)).items()
            if v not in (None, "")
        }
        out.append(
            {
                "payload_bytes": len(data),
                "redelivered": entry.redelivered,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "message_count": len(entries) - i - 1 + queue.message_count,
                "properties": properties or [],
                "payload": text,
                "payload_encoding": encoding,
            }
        )
    if ackmode.endswith("requeue_true"):
        queue.requeue(entries)
    else:
        for entry in entries:
            (queue.settle if ackmode.startswith("ack") else queue.reject)(entry)
    return web.json_response(out)


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


def _policy_kind(request: web.Request) -> bool:
    return request.match_info.get("kind", "policies") == "operator-policies"


async def list_policies(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    out = []
    for v in vhosts:
        out += _admin(request).list_policies(v.name, operator)
    return web.json_response(out)


async def get_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhost = _vhost(request)
    policy = (vhost.operator_policies if operator else vhost.policies).get(
        request.match_info["name"]
    )
    if policy is None:
        raise NotFound(request.match_info["name"])
    return web.json_response({"vhost": vhost.name, **policy.record()})


async def put_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    user = request["user"]
    if not {"administrator", "policymaker"} & set(user.tags):
        raise Denied("Not administrator or policymaker user")
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    existed = name in (vhost.operator_policies if operator else vhost.policies)
    for key in ("pattern", "definition"):
        if key not in body:
            raise InvalidValue(f"{key} not found")
    _admin(request).set_policy(
        vhost.name,
        name,
        body["pattern"],
        body["definition"],
        body.get("priority", 0),
        body.get("apply-to", "all"),
        operator,
    )
    return _ok(204 if existed else 201)


async def delete_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    user = request["user"]
    if not {"administrator", "policymaker"} & set(user.tags):
        raise Denied("Not administrator or policymaker user")
    vhost = _vhost(request)
    _admin(request).clear_policy(vhost.name, request.match_info["name"], operator)
    return _ok()


async def list_topic_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = request.match_info.get("vhost")
    user = request.match_info.get("user")
    return web.json_response(_admin(request).list_topic_permissions(vhost=vhost, user=user))


async def put_topic_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    body = _body_dict(await read_json(request))
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    broker = _broker(request)
    if vhost not in broker.vhosts or user not in broker.access.users:
        raise InvalidValue("vhost_or_user_not_found")
    if "exchange" not in body:
        raise InvalidValue("exchange not found")
    existed = body["exchange"] in broker.access.topics(user, vhost)
    _admin(request).set_topic_permissions(
        user, vhost, body["exchange"], body.get("write", ""), body.get("read", "")
    )
    return _ok(204 if existed else 201)


async def delete_topic_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).clear_topic_permissions(
        request.match_info["user"], request.match_info["vhost"], request.query.get("exchange")
    )
    return _ok()


async def list_vhost_limits(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    return web.json_response([{"vhost": v.name, "value": v.limits} for v in vhosts if v.limits])


async def put_vhost_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    if "value" not in body:
        raise InvalidValue("value not found")
    _admin(request).set_vhost_limits(vhost.name, {request.match_info["name"]: body["value"]})
    return _ok()


async def delete_vhost_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = _vhost(request)
    _admin(request).clear_vhost_limits(vhost.name, request.match_info["name"])
    return _ok()


def add_more_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_put("/api/queues/{vhost}/{name}", put_queue)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    r.add_get("/api/bindings", list_bindings)
    r.add_get("/api/bindings/{vhost}", list_bindings)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", bindings_between)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", post_binding)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", delete_binding)
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/vhosts/{vhost}/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", delete_connection)
    for kind in ("policies", "operator-policies"):
        r.add_get(f"/api/{kind}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}/{{name}}", get_policy)
        r.add_put(f"/api/{kind}/{{vhost}}/{{name}}", put_policy)
        r.add_delete(f"/api/{kind}/{{vhost}}/{{name}}", delete_policy)
    r.add_get("/api/topic-permissions", list_topic_permissions)
    r.add_get("/api/topic-permissions/{vhost}/{user}", list_topic_permissions)
    r.add_put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    r.add_delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permission)
    r.add_get("/api/vhost-limits", list_vhost_limits)
    r.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    r.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    r.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
