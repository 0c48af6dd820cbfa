"""Publishing to an exchange and getting from a queue over HTTP."""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web
from pamqp import commands

from leveret.broker import definitions_json
from leveret.broker.errors import InvalidValue
from leveret.broker.message import Message
from leveret.management.app import Denied, error, read_json
from leveret.management.routes.common import (
    _access_check,
    _body_dict,
    _broker,
    _int,
    _permission_guard,
    _vhost,
    bad_request,
    exchange_param,
    require_keys,
)
from leveret.protocol.errors import AMQPError
from leveret.protocol.properties import decode_properties, encode_header, parse_header

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


async def publish(request: web.Request) -> web.Response:
    """POST .../publish, answered as RabbitMQ's (which publishes through an AMQP channel
    of its own: a refusal or a missing exchange closes it, and comes back as 400 with
    the channel's close text)."""
    vhost = _vhost_or_refused(request)
    body = _body_dict(await read_json(request))
    name = exchange_param(request)
    require_keys(body, ("routing_key", "properties", "payload", "payload_encoding"))
    routing_key = body["routing_key"]
    if isinstance(routing_key, int | float) and not isinstance(routing_key, bool):
        routing_key = str(routing_key)  # RabbitMQ takes a number as its text
    if not isinstance(routing_key, str):
        raise InvalidValue(f"routing_key must be a string, got {json.dumps(routing_key)}")
    payload, encoding = body["payload"], body["payload_encoding"]
    if not isinstance(payload, str):
        raise InvalidValue("payload_not_string")
    if encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (ValueError, TypeError):
            raise bad_request("bad_request", ["not_base64", payload]) from None
    elif encoding == "string":
        data = payload.encode()
    else:
        raise bad_request("bad_request", ["unsupported_encoding", encoding])
    properties = _properties(body["properties"])
    guard = _permission_guard(request, vhost)
    if guard is not None:
        try:
            guard.check_publish(name, routing_key)
        except AMQPError as exc:
            raise InvalidValue(f"{exc.code} {exc.reply_text}") from None
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise InvalidValue(f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost.name}'")
    header = encode_header(len(data), properties)
    _cls, _w, _size, flags, delivery_mode = parse_header(header)
    message = Message(name, routing_key, header, data, flags, delivery_mode == 2)
    queues = vhost.route(exchange, message)
    for queue in queues:
        queue.enqueue(message, None)
    return web.json_response({"routed": bool(queues)})


# Basic properties the API takes, and what RabbitMQ says when one has the wrong type.
_INT_PROPERTIES = ("delivery_mode", "priority")
_STRING_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def _properties(value: Any) -> commands.Basic.Properties:
    """RabbitMQ ignores unknown keys and answers ["not_int", key] (or not_string) for a
    known one of the wrong type."""
    if not isinstance(value, dict):
        raise InvalidValue(f"properties must be a JSON object, got {json.dumps(value)}")
    props: dict[str, Any] = {}
    for key, item in value.items():
        if key in _INT_PROPERTIES or key == "timestamp":
            if isinstance(item, bool) or not isinstance(item, int):
                raise bad_request("bad_request", ["not_int", key])
            props[key] = item
        elif key in _STRING_PROPERTIES:
            if not isinstance(item, str):
                raise bad_request("bad_request", ["not_string", key])
            props[key] = item
        elif key == "headers":
            if not isinstance(item, dict):
                raise bad_request("bad_request", ["not_table", key])
            props[key] = item
    try:
        return commands.Basic.Properties(**props)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"bad properties: {exc}") from None


def _vhost_or_refused(request: web.Request) -> Any:
    """RabbitMQ opens a channel into the vhost for publish and get: a vhost that does
    not exist refuses the login (401 "Access refused.")."""
    if request.match_info["vhost"] not in _broker(request).vhosts:
        raise Denied("Access refused.")
    return _vhost(request)


async def get_messages(request: web.Request) -> web.Response:
    vhost = _vhost_or_refused(request)
    body = _body_dict(await read_json(request))
    require_keys(body, ("ackmode", "count", "encoding"))
    count, ackmode, encoding = _int(body, "count", 1), body["ackmode"], body["encoding"]
    truncate = _int(body, "truncate", 0) if "truncate" in body else None
    if encoding not in ("auto", "base64"):
        raise InvalidValue("Unsupported encoding. Please use auto or base64.")
    if ackmode not in ACK_MODES:
        # RabbitMQ crashes (500); Leveret names the choices.
        raise InvalidValue("ackmode must be one of " + ", ".join(ACK_MODES))
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        name = request.match_info["name"]
        return error(404, "not_found", f"NOT_FOUND - no queue '{name}' in vhost '{vhost.name}'")
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
        if not data:
            text, encoding = "", "base64"  # as RabbitMQ's "auto" for an empty payload
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
