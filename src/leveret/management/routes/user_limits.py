"""Per-user limits, `/api/user-limits`, as RabbitMQ 3.10's management API has them.

GET lists users that have limits (`[{"user": ..., "value": {...}}]`), to any
management user; PUT and DELETE of one limit are for administrators. The limits
themselves live on the user (broker.admin), so definitions and `leveret ctl`
see the same ones.
"""

from __future__ import annotations

from aiohttp import web

from leveret.broker.errors import InvalidValue
from leveret.management.app import error, not_found, read_json
from leveret.management.routes.common import _admin, _broker, _ok, _require_admin, listing


async def list_user_limits(request: web.Request) -> web.Response:
    name = request.match_info.get("user")
    if name is not None and name not in _broker(request).access.users:
        return not_found()
    return listing(request, _admin(request).list_user_limits(name))


async def put_user_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    name = request.match_info["user"]
    body = await read_json(request)
    if not isinstance(body, dict) or "value" not in body:
        raise InvalidValue("[{key_missing,value}]")
    if name not in _broker(request).access.users:
        return error(400, "bad_request", ["no_such_user", name])
    _admin(request).set_user_limits(name, {request.match_info["name"]: body["value"]})
    return _ok()


async def delete_user_limit(request: web.Request) -> web.Response:
    _require_admin(request)
    name = request.match_info["user"]
    if name not in _broker(request).access.users:
        return not_found()  # RabbitMQ 3.10 answers 500 here
    _admin(request).clear_user_limits(name, request.match_info["name"])
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/user-limits", list_user_limits)
    r.add_get("/api/user-limits/{user}", list_user_limits)
    r.add_put("/api/user-limits/{user}/{name}", put_user_limit)
    r.add_delete("/api/user-limits/{user}/{name}", delete_user_limit)
