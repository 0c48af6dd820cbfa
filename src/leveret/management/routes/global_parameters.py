"""Global parameters and the cluster name, as RabbitMQ 3.10's management API has them.

`/api/global-parameters[/{name}]`: any JSON value under any name, for
administrators and policymakers (401 "User not authorised to access object" for
others); PUT answers 201 for a new name, 204 for a changed one. `cluster_name` is
one of them: setting it there or with `PUT /api/cluster-name` (administrators)
is the same, and clearing it brings the default name back. The values live in
broker.global_parameters (stored in the catalog; definitions export them).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.errors import InvalidValue
from leveret.broker.global_parameters import CLUSTER_NAME
from leveret.management.app import Denied, not_found, read_json
from leveret.management.routes.common import (
    _broker,
    _ok,
    _require_admin,
    _tags,
    listing,
    require_keys,
)


def _require_policymaker(request: web.Request) -> None:
    """RabbitMQ's is_authorized_global_parameters: policymaker or administrator."""
    if not {"policymaker", "administrator"} & _tags(request):
        raise Denied("User not authorised to access object")


async def _object_body(request: web.Request) -> dict[str, Any]:
    """A JSON object; anything else is RabbitMQ's 400 not_json."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidValue("not_json")
    return body


async def list_global_parameters(request: web.Request) -> web.Response:
    _require_policymaker(request)
    return listing(request, _broker(request).global_parameters.list())


async def get_global_parameter(request: web.Request) -> web.Response:
    _require_policymaker(request)
    name = request.match_info["name"]
    values = _broker(request).global_parameters.values
    if name not in values:
        return not_found()
    return web.json_response({"name": name, "value": values[name]})


async def put_global_parameter(request: web.Request) -> web.Response:
    _require_policymaker(request)
    body = await _object_body(request)
    require_keys(body, ("value",))
    existed = _broker(request).global_parameters.set(request.match_info["name"], body["value"])
    return _ok(204 if existed else 201)


async def delete_global_parameter(request: web.Request) -> web.Response:
    _require_policymaker(request)
    name = request.match_info["name"]
    params = _broker(request).global_parameters
    if name not in params.values:
        return not_found()
    params.clear(name)
    return _ok()


async def get_cluster_name(request: web.Request) -> web.Response:
    return web.json_response({"name": _broker(request).cluster_name})


async def put_cluster_name(request: web.Request) -> web.Response:
    """Always 204 (the name always exists), as RabbitMQ."""
    _require_admin(request)
    body = await _object_body(request)
    require_keys(body, ("name",))
    if not isinstance(body["name"], str):
        # RabbitMQ crashes (500) on a number or an object and joins a list of strings.
        raise InvalidValue("name must be a string")
    _broker(request).global_parameters.set(CLUSTER_NAME, body["name"])
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/global-parameters", list_global_parameters)
    r.add_get("/api/global-parameters/{name}", get_global_parameter)
    r.add_put("/api/global-parameters/{name}", put_global_parameter)
    r.add_delete("/api/global-parameters/{name}", delete_global_parameter)
    r.add_get("/api/cluster-name", get_cluster_name)
    r.add_put("/api/cluster-name", put_cluster_name)
