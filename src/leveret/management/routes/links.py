"""Runtime parameters, shovels and federation links (RabbitMQ's plugin endpoints).

- `/api/parameters[/{component}[/{vhost}[/{name}]]]`: GET; PUT `{"value": ...}`
  (201 created, 204 updated) and DELETE for one. Policymakers and administrators,
  as in RabbitMQ. A refused value is 400 with RabbitMQ's "Validation failed"
  text, its `<` and `>` written as `&lt;` and `&gt;` as RabbitMQ's API does.
- `/api/shovels[/{vhost}]`, `/api/shovels/vhost/{vhost}/{name}` (GET lists the
  vhost's, as RabbitMQ does; DELETE deletes the shovel) and
  `.../{name}/restart` (DELETE restarts it).
- `/api/federation-links[/{vhost}]`, `.../state/down`, and
  `/api/federation-links/vhost/{vhost}/{id}/{node}/restart` (DELETE).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.parameters import ParameterError
from leveret.management.app import Denied, read_json
from leveret.management.routes.common import _broker, _ok, _server, _vhost, _visible_vhosts, listing


def _may_set_parameters(request: web.Request) -> None:
    """RabbitMQ's is_authorized_policies: administrators and policymakers."""
    if not {"administrator", "policymaker"} & set(request["user"].tags):
        raise Denied("User not authorised to access object")


def _monitor(request: web.Request) -> None:
    """RabbitMQ's plugins show shovels and links to monitoring users and administrators."""
    if not {"administrator", "monitoring"} & set(request["user"].tags):
        raise Denied("Not monitor user")


def _bad(reason: str) -> web.Response:
    escaped = reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return web.json_response({"error": "bad_request", "reason": escaped}, status=400)


# --- parameters ---------------------------------------------------------------------


async def list_parameters(request: web.Request) -> web.Response:
    _may_set_parameters(request)
    component = request.match_info.get("component")
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    params = _broker(request).parameters
    out = []
    for v in vhosts:
        out += params.list(v.name, component)
        if component in (None, "operator_policy"):  # RabbitMQ keeps them as parameters
            out += [
                {"value": value, "vhost": v.name, "component": "operator_policy", "name": name}
                for name, value in _operator_policies(v)
            ]
    return listing(request, out)


def _operator_policies(vhost: Any) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for policy in sorted(vhost.operator_policies.values(), key=lambda p: p.name):
        record = policy.record()
        del record["name"]
        out.append((policy.name, record))
    return out


async def get_parameter(request: web.Request) -> web.Response:
    _may_set_parameters(request)
    vhost = _vhost(request)
    component, name = request.match_info["component"], request.match_info["name"]
    value = _broker(request).parameters.get(vhost.name, component, name)
    return web.json_response(
        {"value": value, "vhost": vhost.name, "component": component, "name": name}
    )


async def put_parameter(request: web.Request) -> web.Response:
    _may_set_parameters(request)
    name = request.match_info["vhost"]
    if name not in _broker(request).vhosts:
        return web.json_response({"error": "not_found", "reason": "vhost_not_found"}, status=404)
    vhost = _vhost(request)
    body = await read_json(request)
    if not isinstance(body, dict) or "value" not in body:
        return _bad("[{key_missing,value}]")
    try:
        created = _broker(request).parameters.set(
            vhost.name,
            request.match_info["component"],
            request.match_info["name"],
            body["value"],
            request["user"],
        )
    except ParameterError as exc:
        return _bad(str(exc))
    except InvalidValue as exc:
        return _bad(str(exc))
    return _ok(201 if created else 204)


async def delete_parameter(request: web.Request) -> web.Response:
    _may_set_parameters(request)
    vhost = _vhost(request)
    _broker(request).parameters.clear(
        vhost.name, request.match_info["component"], request.match_info["name"]
    )
    return _ok()


# --- shovels --------------------------------------------------------------------------


def _links(request: web.Request):
    links = _server(request).links
    if links is None:
        raise NotFound("links are not running")
    return links


async def list_shovels(request: web.Request) -> web.Response:
    _monitor(request)
    names = {v.name for v in _visible_vhosts(request)}
    if "vhost" in request.match_info:
        names &= {_vhost(request).name}
    status = [s for s in _links(request).shovel_status() if s["vhost"] in names]
    name = request.match_info.get("name")
    if name is not None and not any(s["name"] == name for s in status):
        raise NotFound(name)  # the vhost's list when it has that shovel, as RabbitMQ
    return listing(request, status)


async def delete_shovel(request: web.Request) -> web.Response:
    _monitor(request)
    vhost = _vhost(request)
    name = request.match_info["name"]
    links = _links(request)
    if (vhost.name, name) not in links.shovels:
        raise NotFound(name)
    if request.path.endswith("/restart"):
        await links.restart_shovel(vhost.name, name)
    else:
        links.delete_shovel(vhost.name, name)
    return _ok()


# --- federation links --------------------------------------------------------------------


async def list_federation_links(request: web.Request) -> web.Response:
    _monitor(request)
    names = {v.name for v in _visible_vhosts(request)}
    if "vhost" in request.match_info:
        names &= {_vhost(request).name}
    federation = _links(request).federation
    status = [s for s in federation.status() if s["vhost"] in names]
    if request.path.rstrip("/").endswith("/state/down"):
        status = [s for s in status if s["status"] not in ("running", "starting")]
    return listing(request, status)


async def restart_federation_link(request: web.Request) -> web.Response:
    _monitor(request)
    vhost = _vhost(request)
    if not await _links(request).federation.restart(vhost.name, request.match_info["id"]):
        raise NotFound(request.match_info["id"])
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/parameters", list_parameters)
    r.add_get("/api/parameters/{component}", list_parameters)
    r.add_get("/api/parameters/{component}/{vhost}", list_parameters)
    r.add_get("/api/parameters/{component}/{vhost}/{name}", get_parameter)
    r.add_put("/api/parameters/{component}/{vhost}/{name}", put_parameter)
    r.add_delete("/api/parameters/{component}/{vhost}/{name}", delete_parameter)
    r.add_get("/api/shovels", list_shovels)
    r.add_get("/api/shovels/{vhost}", list_shovels)
    r.add_get("/api/shovels/vhost/{vhost}/{name}", list_shovels)
    r.add_delete("/api/shovels/vhost/{vhost}/{name}", delete_shovel)
    r.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", delete_shovel)
    r.add_get("/api/federation-links", list_federation_links)
    r.add_get("/api/federation-links/state/down", list_federation_links)
    r.add_get("/api/federation-links/state/down/", list_federation_links)
    r.add_get("/api/federation-links/{vhost}", list_federation_links)
    r.add_get("/api/federation-links/{vhost}/state/down", list_federation_links)
    r.add_delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart", restart_federation_link)
