"""Vhosts, users, permissions, topic permissions and vhost limits."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from leveret.broker.admin import VHOST_LIMITS
from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.queues.remote import RemoteQueue
from leveret.management.app import error, read_json
from leveret.management.routes.common import (
    NODE,
    _admin,
    _body_dict,
    _bool,
    _broker,
    _ok,
    _require_admin,
    _vhost,
    _visible_vhosts,
    listing,
    require_keys,
    vhosts_message_stats,
    worker_stats,
)


def _vhost_json(request: web.Request, vhost: Any) -> dict[str, Any]:
    """A vhost as RabbitMQ shows it: message figures once it has queues, octets once it
    has had connections (RabbitMQ's statistics appear with their first event)."""
    message_stats = vhosts_message_stats(request, [vhost])
    out: dict[str, Any] = {
        "cluster_state": {NODE: "running"},
        # RabbitMQ 3.10 shows the string "undefined" when the vhost has none.
        "default_queue_type": vhost.default_queue_type or "undefined",
        "description": vhost.description,
        **({"message_stats": message_stats} if message_stats else {}),
        "metadata": {
            "description": vhost.description,
            "tags": vhost.tags,
            **({"default_queue_type": q} if (q := vhost.default_queue_type) else {}),
        },
        "name": vhost.name,
        "tags": vhost.tags,
        "tracing": False,
    }
    if vhost.queues:
        ready = unacked = 0
        ready_rate = unacked_rate = 0.0
        for q in vhost.queues.values():
            if q.__class__ is RemoteQueue:
                continue  # another worker's: its figures are in its report, added below
            ready += q.message_count
            unacked += q.unacked
            rates = q.stats.depth_rates
            ready_rate += rates[0]
            unacked_rate += rates[1]
        stats = worker_stats(request)
        if stats is not None:
            more = stats.queue_totals([vhost])
            ready, unacked = ready + more[0], unacked + more[1]
            ready_rate, unacked_rate = ready_rate + more[3], unacked_rate + more[4]
        out |= {
            "messages": ready + unacked,
            "messages_details": {"rate": round(ready_rate + unacked_rate, 1)},
            "messages_ready": ready,
            "messages_ready_details": {"rate": round(ready_rate, 1)},
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": {"rate": round(unacked_rate, 1)},
        }
    conns = [c for c in _broker(request).connections if c.vhost is vhost]
    stats = worker_stats(request)
    # each worker's clients in the vhost: other workers' from their reports
    others = stats.vhost_octets(vhost.name) if stats is not None else []
    if conns or any(vhost.octets) or others:
        recv = vhost.octets[0] + sum(c.recv_oct for c in conns) + sum(o[0] for o in others)
        send = vhost.octets[1] + sum(c.send_oct for c in conns) + sum(o[1] for o in others)
        recv_rate = sum(_oct_rate(c, 0) for c in conns) + sum(o[2] for o in others)
        send_rate = sum(_oct_rate(c, 1) for c in conns) + sum(o[3] for o in others)
        out |= {
            "recv_oct": recv,
            "recv_oct_details": {"rate": round(recv_rate, 1)},
            "send_oct": send,
            "send_oct_details": {"rate": round(send_rate, 1)},
        }
    return out


def _oct_rate(conn: Any, i: int) -> float:
    rates = getattr(conn, "octet_rates", None)
    return rates[i] if rates else 0.0


async def list_vhosts(request: web.Request) -> web.Response:
    vhosts = [_vhost_json(request, v) for v in _visible_vhosts(request)]
    return listing(request, vhosts, paginated=True)


async def get_vhost(request: web.Request) -> web.Response:
    _require_admin(request)  # as RabbitMQ 3.10 (rabbit_mgmt_wm_vhost)
    return web.json_response(_vhost_json(request, _vhost(request)))


async def put_vhost(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    _body_dict(body)
    name = request.match_info["vhost"]
    existed = name in _broker(request).vhosts
    tags = body.get("tags", [])
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise InvalidValue("tags must be a comma-separated string or a list of strings")
    _bool(body, "tracing", False)
    description = body.get("description", "")
    if not isinstance(description, str):
        description = json.dumps(description)  # RabbitMQ keeps what it was given
    # RabbitMQ 3.10 reads `defaultqueuetype`; later versions `default_queue_type`.
    default_type = body.get("defaultqueuetype", body.get("default_queue_type"))
    _admin(request).add_vhost(
        name,
        description,
        tags,
        exist_ok=True,
        user=request["user"].name,
        default_queue_type=default_type,
    )
    if not existed:
        # As RabbitMQ: whoever creates a vhost may use it at once.
        _admin(request).set_permissions(request["user"].name, name, ".*", ".*", ".*")
    return _ok(204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).delete_vhost(request.match_info["vhost"])
    return _ok()


def _user_json(user: Any) -> dict[str, Any]:
    return user.record()


async def list_users(request: web.Request) -> web.Response:
    _require_admin(request)
    users = sorted(_broker(request).access.users.values(), key=lambda u: u.name)
    return listing(request, [_user_json(u) for u in users])


async def get_user(request: web.Request) -> web.Response:
    _require_admin(request)
    return web.json_response(_user_json(_admin(request).user(request.match_info["user"])))


async def put_user(request: web.Request) -> web.Response:
    _require_admin(request)
    body = await read_json(request)
    _body_dict(body)
    name = request.match_info["user"]
    existed = name in _broker(request).access.users
    if "tags" in body:
        tags = body["tags"]
    elif "administrator" in body:
        # RabbitMQ's older form of the tags: administrator true or false.
        tags = ["administrator"] if _bool(body, "administrator", False) else []
    else:
        raise InvalidValue("tags_not_present")
    if "password" in body and "password_hash" in body:
        raise InvalidValue("both_password_and_password_hash_are_provided")
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
        # As RabbitMQ: neither a password nor a hash takes the password away. The user
        # logs in with a certificate (SASL EXTERNAL) only from then on.
        _admin(request).set_user_tags(name, tags)
        _admin(request).clear_password(name)
    else:
        # As RabbitMQ: the user is made with the empty password, which no login takes.
        _admin(request).add_user(name, "", tags)
    # RabbitMQ also takes the user's permissions in the same body: {vhost: {configure,
    # write, read}}.
    permissions = body.get("permissions")
    if isinstance(permissions, dict):
        for vhost, perms in permissions.items():
            perms = _body_dict(perms)
            require_keys(perms, ("configure", "write", "read"))
            _admin(request).set_permissions(
                name, vhost, perms["configure"], perms["write"], perms["read"]
            )
    return _ok(204 if existed else 201)


async def users_without_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    broker = _broker(request)
    with_permissions = {user for user, _ in broker.access.permissions}
    users = sorted(broker.access.users.values(), key=lambda u: u.name)
    return listing(request, [_user_json(u) for u in users if u.name not in with_permissions])


async def bulk_delete_users(request: web.Request) -> web.Response:
    """POST {"users": [...]}. All names are checked first, so a missing one deletes nothing
    (RabbitMQ deletes the names before it)."""
    _require_admin(request)
    body = _body_dict(await read_json(request))
    names = body.get("users")
    if names is None:
        raise InvalidValue("[{key_missing,users}]")
    if not isinstance(names, list):
        raise InvalidValue("users must be a list of user names")
    users = _broker(request).access.users
    for name in names:
        if name not in users:
            return error(400, "bad_request", ["no_such_user", name])
    if not all(isinstance(n, str) for n in names):
        raise InvalidValue("users must be a list of user names")
    for name in dict.fromkeys(names):
        _admin(request).delete_user(name)
    return _ok()


async def delete_user(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).delete_user(request.match_info["user"])
    return _ok()


async def list_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return listing(request, _admin(request).list_permissions())


async def vhost_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return listing(request, _admin(request).list_permissions(vhost=_vhost(request).name))


async def user_permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    return listing(request, _admin(request).list_permissions(user=request.match_info["user"]))


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
    _body_dict(body)
    require_keys(body, ("configure", "write", "read"))
    existed = broker.access.permission(user, vhost) is not None
    _admin(request).set_permissions(
        user, vhost, body.get("configure", ""), body.get("write", ""), body.get("read", "")
    )
    return _ok(204 if existed else 201)


async def delete_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    _admin(request).clear_permissions(request.match_info["user"], request.match_info["vhost"])
    return _ok()


async def list_topic_permissions(request: web.Request) -> web.Response:
    """All, one vhost's, one user's, or one user's in one vhost (404 for unknown names)."""
    _require_admin(request)
    vhost = request.match_info.get("vhost")
    user = request.match_info.get("user")
    if vhost is not None:
        _vhost(request)
    if user is not None:
        _admin(request).user(user)
    found = _admin(request).list_topic_permissions(vhost=vhost, user=user)
    if vhost is not None and user is not None and not found:
        raise NotFound(user)
    return listing(request, found)


async def put_topic_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    body = _body_dict(await read_json(request))
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    broker = _broker(request)
    if vhost not in broker.vhosts or user not in broker.access.users:
        raise InvalidValue("vhost_or_user_not_found")
    require_keys(body, ("exchange", "write", "read"))
    exchange = body["exchange"]
    if not isinstance(exchange, str):
        exchange = json.dumps(exchange)  # RabbitMQ takes a number as its text
    # RabbitMQ's resource is the user's topic permissions in the vhost: a PUT for
    # another exchange updates it (204).
    existed = bool(broker.access.topics(user, vhost))
    _admin(request).set_topic_permissions(user, vhost, exchange, body["write"], body["read"])
    return _ok(204 if existed else 201)


async def delete_topic_permission(request: web.Request) -> web.Response:
    _require_admin(request)
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    # The exchange as a path segment (RabbitMQ 3.10's dispatcher) or a query parameter.
    exchange = request.match_info.get("exchange", request.query.get("exchange"))
    topics = _broker(request).access.topics(user, vhost)
    if exchange is not None and topics and exchange not in topics:
        return _ok()  # RabbitMQ: nothing to clear for that exchange is not an error
    _admin(request).clear_topic_permissions(user, vhost, exchange)
    return _ok()


async def list_vhost_limits(request: web.Request) -> web.Response:
    if "vhost" in request.match_info:
        vhosts = [_vhost(request, visible=True)]
    else:
        vhosts = _visible_vhosts(request)
    return listing(request, [{"vhost": v.name, "value": v.limits} for v in vhosts if v.limits])


async def put_vhost_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    if request.match_info["vhost"] not in _broker(request).vhosts:
        return error(404, "not_found", "vhost_not_found")
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    require_keys(body, ("value",))
    name, value = request.match_info["name"], body["value"]
    # RabbitMQ's runtime-parameter validation texts.
    if name not in VHOST_LIMITS:
        shown = json.dumps(value)
        raise InvalidValue(
            f'Validation failed\n\nUnrecognised terms [{{<<"{name}">>,{shown}}}] in limits\n'
        )
    if isinstance(value, bool) or not isinstance(value, int):
        shown = f'<<"{value}">>' if isinstance(value, str) else json.dumps(value)
        raise InvalidValue(
            f"Validation failed\n\n{name} should be a number, actually was {shown}\n"
        )
    _admin(request).set_vhost_limits(vhost.name, {name: value})
    return _ok()


async def delete_vhost_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = _vhost(request)
    _admin(request).clear_vhost_limits(vhost.name, request.match_info["name"])
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/vhosts", list_vhosts)
    r.add_get("/api/vhosts/{vhost}", get_vhost)
    r.add_put("/api/vhosts/{vhost}", put_vhost)
    r.add_delete("/api/vhosts/{vhost}", delete_vhost)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/without-permissions", users_without_permissions)
    r.add_post("/api/users/bulk-delete", bulk_delete_users)
    r.add_get("/api/users/{user}", get_user)
    r.add_put("/api/users/{user}", put_user)
    r.add_delete("/api/users/{user}", delete_user)
    r.add_get("/api/users/{user}/permissions", user_permissions)
    r.add_get("/api/permissions", list_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", get_permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
    r.add_get("/api/topic-permissions", list_topic_permissions)
    r.add_get("/api/topic-permissions/{vhost}/{user}", list_topic_permissions)
    r.add_get("/api/vhosts/{vhost}/topic-permissions", list_topic_permissions)
    r.add_get("/api/users/{user}/topic-permissions", list_topic_permissions)
    r.add_put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    r.add_delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permission)
    r.add_delete("/api/topic-permissions/{vhost}/{user}/{exchange}", delete_topic_permission)
    r.add_get("/api/vhost-limits", list_vhost_limits)
    r.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    r.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    r.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
