"""Publishing to an exchange and getting from a queue over HTTP."""

from __future__ import annotations

import base64

from aiohttp import web
from pamqp import commands

from leveret.broker import definitions_json
from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.message import Message
from leveret.management.app import read_json
from leveret.management.routes.common import (
    _access_check,
    _body_dict,
    _int,
    _permission_guard,
    _vhost,
    exchange_param,
)
from leveret.protocol.properties import decode_properties, encode_header, parse_header

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


async def publish(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = exchange_param(request)
    for key in ("routing_key", "payload", "payload_encoding", "properties"):
        if key not in body:
            raise InvalidValue(f"{key} not found")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _access_check(guard.check_publish, name, body["routing_key"])
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


async def get_messages(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    body = _body_dict(await read_json(request))
    count, ackmode = _int(body, "count", 1), body.get("ackmode")
    truncate = _int(body, "truncate", 0) if "truncate" in body else None
    if ackmode not in ACK_MODES:
        raise InvalidValue("ackmode must be one of " + ", ".join(ACK_MODES))
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _access_check(guard.require, "read", "queue", queue.name)
    if queue.queue_type != "classic":
        raise InvalidValue(f"cannot get from a {queue.queue_type} queue")
    entries = []
    while len(entries) < count:
        entry = queue.get()
        if entry is None:
            break
        queue.unacked += 1
        entries.append(entry)
    queue.stats.get += len(entries)  # the API's get acknowledges like a channel's would
    out = []
    for i, entry in enumerate(entries):
        message = queue.with_body(entry)
        data = message.body or b""
        size = len(data)
        if truncate is not None:
            data = data[:truncate]
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
                "payload_bytes": size,
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


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
