"""Helpers every route module shares: the request's broker, vhost visibility, body checks."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.errors import InvalidValue, NotFound
from leveret.management.app import SERVER_KEY, Denied
from leveret.protocol.constants import ACCESS_REFUSED as ACCESS_REFUSED_CODE
from leveret.protocol.constants import NOT_FOUND as NOT_FOUND_CODE
from leveret.protocol.errors import AMQPError
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
