"""Publishing to an exchange and getting from a queue over HTTP."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from aiohttp import web

from leveret.broker import definitions_json, direct_reply
from leveret.broker.errors import InvalidValue, NotFound, PreconditionFailed
from leveret.broker.message import Message
from leveret.broker.queue_args import amqp_type_name, parse_expiration
from leveret.broker.queues.remote import RemoteQueue
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
    worker_stats,
)
from leveret.protocol.errors import AMQPError
from leveret.protocol.properties import BasicProperties, parse_header

#: a content header's class, weight and body size; the property flags and list follow
_HEAD = struct.Struct(">HHQ")
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
    if exchange.internal:
        raise InvalidValue(f"403 ACCESS_REFUSED - cannot publish to internal {exchange.describe()}")
    ttl = _check_message(request, properties)
    keys = _sender_routes(properties, routing_key)
    header = _HEAD.pack(60, 0, len(data)) + properties.encode()
    _cls, _w, _size, flags, delivery_mode = parse_header(header)
    message = Message(name, routing_key, header, data, flags, delivery_mode == 2)
    message.ttl = ttl
    if keys is None:
        queues = vhost.route(exchange, message)
    else:
        message.routing_keys = keys
        queues = vhost.route_keys(exchange, message, keys)
    for queue in queues:
        queue.enqueue(message, None)
    return web.json_response({"routed": bool(queues)})


# The API's property names are RabbitMQ's (the AMQP spec's: `type`, not pamqp's
# `message_type`). RabbitMQ ignores unknown keys and answers ["not_int", key] (or
# not_string) for a known one of the wrong type.
_INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")
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
#: what the AMQP fields hold: priority an octet, timestamp seconds in 64 bits
_RANGES = {"priority": (0, 255), "timestamp": (0, 2**64 - 1)}


def _properties(value: Any) -> BasicProperties:
    """The `properties` of a publish. A value that fits no AMQP field (a priority of
    256, a negative timestamp, a string over 255 bytes) is refused with its name:
    Leveret stores messages as AMQP encodes them."""
    if not isinstance(value, dict):
        raise InvalidValue(f"properties must be a JSON object, got {json.dumps(value)}")
    props = BasicProperties()
    for key, item in value.items():
        if key in _INT_PROPERTIES:
            if isinstance(item, bool) or not isinstance(item, int):
                raise bad_request("bad_request", ["not_int", key])
            low, high = _RANGES.get(key, (None, None))
            if low is not None and not low <= item <= high:
                raise InvalidValue(
                    f"property {key} must be an integer from {low} to {high}, got {item}"
                )
            setattr(props, key, item)
        elif key in _STRING_PROPERTIES:
            if not isinstance(item, str):
                raise bad_request("bad_request", ["not_string", key])
            if len(item.encode()) > 255:
                raise InvalidValue(f"property {key} is longer than 255 bytes of UTF-8")
            setattr(props, key, item)
        elif key == "headers":
            props.headers = _headers(item)
    return props


def _headers(value: Any) -> dict[str, Any]:
    """The headers table. As RabbitMQ: a null anywhere in it is 400 null_not_allowed,
    and an array stands for an empty table (an empty Erlang property list)."""
    if isinstance(value, list):
        return {}
    if not isinstance(value, dict):
        raise bad_request("bad_request", ["not_table", "headers"])  # RabbitMQ: 500

    def check(item: Any) -> None:
        if item is None:
            raise bad_request("bad_request", "null_not_allowed")
        for inner in (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        ):
            check(inner)

    check(value)
    return value


def _check_message(request: web.Request, props: BasicProperties) -> int | None:
    """What RabbitMQ's channel checks in a publish, in its order and words (a 406 that
    comes back as 400): direct reply-to (the API's channel has no reply consumer),
    user_id, expiration (its TTL in ms, returned), delivery_mode."""
    if props.reply_to == direct_reply.PSEUDO_QUEUE:
        raise InvalidValue("406 PRECONDITION_FAILED - fast reply consumer does not exist")
    user = request["user"]
    if props.user_id is not None and props.user_id != user.name and not user.is_impersonator:
        raise InvalidValue(
            f"406 PRECONDITION_FAILED - user_id property set to '{props.user_id}' but "
            f"authenticated user was '{user.name}'"
        )
    ttl = None
    if props.expiration is not None:
        try:
            ttl = parse_expiration(props.expiration)
        except PreconditionFailed as exc:
            raise InvalidValue(f"406 PRECONDITION_FAILED - {exc}") from None
    if props.delivery_mode is not None and props.delivery_mode not in (1, 2):
        raise InvalidValue(
            "406 PRECONDITION_FAILED - invalid message: "
            f"{{delivery_mode_unknown,{props.delivery_mode}}}"
        )
    return ttl


def _json_amqp_type(value: Any) -> str:
    """The field-table type RabbitMQ gives a JSON value in a header (an integer is a
    long, whatever its size)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "long"
    return amqp_type_name(value)


def _sender_routes(props: BasicProperties, routing_key: str) -> list[str] | None:
    """The routing keys of the CC and BCC headers with the message's own (None: only its
    own), as over AMQP; BCC is taken out of the headers the queues get."""
    headers = props.headers
    if not headers or ("CC" not in headers and "BCC" not in headers):
        return None
    keys = [routing_key]
    for name in ("CC", "BCC"):
        if name in headers:
            extra = headers[name]
            if not isinstance(extra, list):
                raise InvalidValue(
                    "406 PRECONDITION_FAILED - invalid message: "
                    f'{{unacceptable_type_in_header,"{name}",{_json_amqp_type(extra)}}}'
                )
            keys += [str(k) for k in extra]
    if "BCC" in headers:
        props.headers = {k: v for k, v in headers.items() if k != "BCC"}
    return keys


def _properties_json(header: bytes) -> dict[str, Any] | list[Any]:
    """A message's properties as RabbitMQ's get shows them: its names, a timestamp in
    seconds, `[]` when there are none."""
    out: dict[str, Any] = {}
    for key, value in BasicProperties.decode(header).as_dict().items():
        if key == "timestamp":
            value = int(value.timestamp())
        out[key] = definitions_json._jsonable(value)
    return out or []


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
    name = request.match_info["name"]
    guard = _permission_guard(request, vhost)
    if guard is not None:
        # As RabbitMQ's basic.get: the read permission first, then the queue.
        _access_check(guard.require, "read", "queue", name)
    queue = vhost.queues.get(name)
    if queue is None:
        return error(404, "not_found", f"NOT_FOUND - no queue '{name}' in vhost '{vhost.name}'")
    if queue.queue_type != "classic":
        raise InvalidValue(f"cannot get from a {queue.queue_type} queue")
    stats = worker_stats(request)
    if stats is not None and isinstance(queue, RemoteQueue):
        # Taken, shown and settled on the owner, in one turn of its loop as here.
        try:
            got = await stats.on_owner(
                queue, "api_get", vhost.name, name, body, count, ackmode, truncate
            )
        except NotFound as exc:  # RabbitMQ's basic.get's channel error, as for a missing queue
            return error(404, "not_found", f"NOT_FOUND - {exc}")
        return web.json_response(got)
    return web.json_response(get_from(queue, body, count, ackmode, truncate))


def get_from(
    queue: Any, body: dict[str, Any], count: int, ackmode: str, truncate: int | None
) -> list[dict[str, Any]]:
    """Up to `count` messages of `queue` as the API shows them, then requeued, acked or
    rejected as `ackmode` says (the queue's own worker runs this)."""
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
        properties = _properties_json(message.header)
        out.append(
            {
                "payload_bytes": size,
                "redelivered": entry.redelivered,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "message_count": len(entries) - i - 1 + queue.message_count,
                "properties": properties,
                "payload": text,
                "payload_encoding": encoding,
            }
        )
    if ackmode.endswith("requeue_true"):
        queue.requeue(entries)
    else:
        for entry in entries:
            (queue.settle if ackmode.startswith("ack") else queue.reject)(entry)
    return out


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
