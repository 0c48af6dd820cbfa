"""Policies and operator policies."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.policies import PolicyError
from leveret.management.app import error, read_json
from leveret.management.routes.common import (
    _admin,
    _body_dict,
    _broker,
    _ok,
    _require_admin,
    _vhost,
    listing,
    login_vhosts,
    require_keys,
    require_policymaker,
)


def _policy_kind(request: web.Request) -> bool:
    return request.match_info.get("kind", "policies") == "operator-policies"


async def list_policies(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhosts = [_vhost(request)] if "vhost" in request.match_info else login_vhosts(request)
    out = []
    for v in vhosts:
        out += _admin(request).list_policies(v.name, operator)
    return listing(request, out)


def _authorized_vhost(request: web.Request, operator: bool) -> Any:
    """The vhost of one policy, as RabbitMQ authorizes it: an operator policy is for
    administrators ("Not administrator user"), a policy for administrators and
    policymakers who may use its vhost ("User not authorised to access object").
    None when the vhost does not exist."""
    if operator:
        _require_admin(request)
        return _broker(request).vhosts.get(request.match_info["vhost"])
    try:
        return require_policymaker(request)
    except NotFound:
        return None


async def get_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhost = _authorized_vhost(request, operator)
    if vhost is None:
        raise NotFound(request.match_info["vhost"])
    policy = (vhost.operator_policies if operator else vhost.policies).get(
        request.match_info["name"]
    )
    if policy is None:
        raise NotFound(request.match_info["name"])
    return web.json_response({"vhost": vhost.name, **policy.record()})


async def put_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhost = _authorized_vhost(request, operator)
    if vhost is None:
        return error(404, "not_found", "vhost_not_found")
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    existed = name in (vhost.operator_policies if operator else vhost.policies)
    require_keys(body, ("pattern", "definition"))
    try:
        _admin(request).set_policy(
            vhost.name,
            name,
            body["pattern"],
            body["definition"],
            body.get("priority", 0),
            body.get("apply-to", "all"),
            operator,
        )
    except PolicyError as exc:
        # RabbitMQ's text; a policy's is HTML-escaped (rabbit_mgmt_wm_policy), an
        # operator policy's is not.
        reason = f"Validation failed\n\n{exc.rabbit}\n"
        raise InvalidValue(reason if operator else _escape_html(reason)) from None
    return _ok(204 if existed else 201)


def _escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def delete_policy(request: web.Request) -> web.Response:
    operator = request.path.startswith("/api/operator-policies")
    vhost = _authorized_vhost(request, operator)
    if vhost is None:
        raise NotFound(request.match_info["vhost"])
    policies = vhost.operator_policies if operator else vhost.policies
    if request.match_info["name"] not in policies:
        raise NotFound(request.match_info["name"])
    _admin(request).clear_policy(vhost.name, request.match_info["name"], operator)
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    for kind in ("policies", "operator-policies"):
        r.add_get(f"/api/{kind}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}/{{name}}", get_policy)
        r.add_put(f"/api/{kind}/{{vhost}}/{{name}}", put_policy)
        r.add_delete(f"/api/{kind}/{{vhost}}/{{name}}", delete_policy)
