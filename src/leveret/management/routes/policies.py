"""Policies and operator policies."""

from __future__ import annotations

from aiohttp import web

from leveret.broker.errors import InvalidValue, NotFound
from leveret.management.app import Denied, read_json
from leveret.management.routes.common import (
    _admin,
    _body_dict,
    _ok,
    _vhost,
    _visible_vhosts,
    listing,
)


def _policy_kind(request: web.Request) -> bool:
    return request.match_info.get("kind", "policies") == "operator-policies"


async def list_policies(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    out = []
    for v in vhosts:
        out += _admin(request).list_policies(v.name, operator)
    return listing(request, out)


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


def add_routes(r: web.UrlDispatcher) -> None:
    for kind in ("policies", "operator-policies"):
        r.add_get(f"/api/{kind}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}/{{name}}", get_policy)
        r.add_put(f"/api/{kind}/{{vhost}}/{{name}}", put_policy)
        r.add_delete(f"/api/{kind}/{{vhost}}/{{name}}", delete_policy)
