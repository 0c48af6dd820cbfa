"""Queues, exchanges and bindings."""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import quote

from aiohttp import web

from leveret.broker import definitions_json
from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.stats import EXCHANGE_KEYS, QUEUE_KEYS
from leveret.management.app import read_json
from leveret.management.routes.common import (
    _access_check,
    _body_dict,
    _bool,
    _ok,
    _permission_guard,
    _vhost,
    _visible_vhosts,
    exchange_param,
    listing,
)


def _queue_json(vhost: Any, q: Any) -> dict[str, Any]:
    ready = q.message_count
    paged = getattr(q.ready, "paged", 0)
    stats = q.stats
    ready_rate, unacked_rate = stats.depth_rates
    extra: dict[str, Any] = {}
    message_stats = stats.to_json(QUEUE_KEYS)
    if message_stats:
        extra["message_stats"] = message_stats
    if q.queue_type == "stream":  # Leveret: the offsets a reader can start from
        extra["stream_first_offset"] = q.log.first
        extra["stream_next_offset"] = q.log.next
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
        "messages_details": {"rate": round(ready_rate + unacked_rate, 1)},
        "messages_ready_details": {"rate": round(ready_rate, 1)},
        "messages_unacknowledged_details": {"rate": round(unacked_rate, 1)},
        "message_bytes_ready": getattr(q.ready, "bytes", 0),
        # As RabbitMQ's classic queues: ready messages kept as disk positions only
        # (a long queue's paged tail), and the rest, which are objects in RAM.
        "messages_paged_out": paged,
        "messages_ram": ready + q.unacked - paged,
        "messages_ready_ram": ready - paged,
        "exclusive_consumer_tag": next((c.tag for c in q.consumers if c.exclusive), None),
        "node": "leveret@localhost",
        "state": "running",
        **vhost.policy_of("queue", q.name, q.queue_type),
        **extra,
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
        **({"message_stats": stats} if (stats := x.stats.to_json(EXCHANGE_KEYS)) else {}),
    }


async def list_queues(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    queues = [q for v in vhosts for q in sorted(v.queues.values(), key=lambda q: q.name)]
    return listing(request, queues, lambda q: _queue_json(q.vhost, q))


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


async def put_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _access_check(guard.require, "configure", "queue", name)
    existed = name in vhost.queues
    vhost.declare_queue(
        name,
        False,
        _bool(body, "durable", True),
        False,
        _bool(body, "auto_delete", False),
        body.get("arguments") or {},
    )
    return _ok(204 if existed else 201)


class _Named:
    """An object and the name listing() pages by (exchanges know only their vhost's name)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value


def _exchange_from_named(named: _Named) -> dict[str, Any]:
    return _exchange_json(*named.value)


async def list_exchanges(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    pairs = [(v, x) for v in vhosts for x in sorted(v.exchanges.values(), key=lambda x: x.name)]
    return listing(request, [_Named(x.name, (v, x)) for v, x in pairs], _exchange_from_named)


async def get_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = vhost.exchanges.get(exchange_param(request))
    if exchange is None:
        raise NotFound(exchange_param(request))
    return web.json_response(_exchange_json(vhost, exchange))


async def put_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = exchange_param(request)
    if "type" not in body:
        raise InvalidValue("exchange type must be given")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _access_check(guard.require, "configure", "exchange", name)
    existed = name in vhost.exchanges
    vhost.declare_exchange(
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
    name = exchange_param(request)
    if name not in vhost.exchanges:
        raise NotFound(name)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _access_check(guard.require, "configure", "exchange", name)
    vhost.delete_exchange(name, request.query.get("if-unused") == "true")
    return _ok()


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


def _queue_or_404(request: web.Request) -> tuple[Any, Any]:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    return vhost, queue


async def queue_bindings(request: web.Request) -> web.Response:
    """A queue's bindings, its implicit one from the default exchange first (as RabbitMQ)."""
    vhost, queue = _queue_or_404(request)
    default = {
        "source": "",
        "vhost": vhost.name,
        "destination": queue.name,
        "destination_type": "queue",
        "routing_key": queue.name,
        "arguments": {},
        "properties_key": queue.name,
    }
    explicit = sorted(queue.bindings, key=lambda b: (b.source.name, b.routing_key))
    return listing(request, [default, *(_binding_json(vhost, b) for b in explicit)])


async def exchange_bindings(request: web.Request) -> web.Response:
    """Bindings with this exchange as their source, or (…/destination) as their destination."""
    vhost = _vhost(request)
    exchange = vhost.exchanges.get(exchange_param(request))
    if exchange is None:
        raise NotFound(exchange_param(request))
    if request.match_info["side"] == "source":
        found = list(exchange.bindings.values())
    else:
        found = list(exchange.inbound)
    found.sort(key=lambda b: (b.source.name, b.destination.name, b.routing_key))
    return listing(request, [_binding_json(vhost, b) for b in found])


async def list_bindings(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else _visible_vhosts(request)
    return listing(request, [_binding_json(v, b) for v in vhosts for b in _all_bindings(v)])


def _binding_ends(request: web.Request) -> tuple[Any, Any, Any]:
    vhost = _vhost(request)
    source = vhost.exchanges.get(exchange_param(request, "source"))
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
        _access_check(guard.require, "write", kind, dest.name)
        _access_check(guard._check_source, source.name, key)
    vhost.bind(source, dest, key, arguments)
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
            vhost.unbind(
                source.name,
                dest.name,
                request.match_info["kind"] == "q",
                b.routing_key,
                b.arguments,
                None,
            )
            return _ok()
    raise NotFound(props)


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}", exchange_bindings)
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_queues)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_get("/api/exchanges", list_exchanges)
    r.add_get("/api/exchanges/{vhost}", list_exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_put("/api/queues/{vhost}/{name}", put_queue)
    r.add_get("/api/bindings", list_bindings)
    r.add_get("/api/bindings/{vhost}", list_bindings)
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", bindings_between)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", post_binding)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", delete_binding)
