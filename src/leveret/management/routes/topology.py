"""Queues, exchanges and bindings."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Awaitable
from functools import partial
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

from aiohttp import web

from leveret.broker import definitions_json
from leveret.broker.errors import AccessRefused, InvalidValue, NotFound
from leveret.broker.exchange import arguments_key
from leveret.broker.policies import _lower, winner
from leveret.broker.queues.remote import RemoteQueue
from leveret.broker.stats import EXCHANGE_KEYS, QUEUE_KEYS, message_stats_json, total
from leveret.management.app import Denied, error, not_found, read_json
from leveret.management.routes.common import (
    NODE,
    _access_check,
    _body_dict,
    _bool,
    _broker,
    _object,
    _ok,
    _permission_guard,
    _require_admin,
    _vhost,
    bad_request,
    exchange_param,
    listing,
    login_vhosts,
    require_keys,
    worker_stats,
)
from leveret.management.routes.runtime import _consumer_json, idle_since, process_stand_ins


def _effective_policy(vhost: Any, q: Any) -> dict[str, Any]:
    """RabbitMQ's effective_policy_definition: the policy's keys, lowered by the
    operator policy's where that is tighter."""
    policy = winner(vhost.policies, "queue", q.name, q.queue_type)
    operator = winner(vhost.operator_policies, "queue", q.name, q.queue_type)
    merged = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, value in operator.definition.items():
            if key not in merged or _lower(key, value, merged[key]):
                merged[key] = value
    return merged


def _queue_json(vhost: Any, q: Any, single: bool = False) -> dict[str, Any]:
    """One queue as RabbitMQ shows it. The field list lives here (and in
    queue_type_fields for what one queue type adds), so every engineer adding a
    field adds it in one place."""
    ready = q.message_count
    paged = getattr(q.ready, "paged", 0)
    stats = q.stats
    ready_rate, unacked_rate = stats.depth_rates
    ready_bytes = getattr(q.ready, "bytes", 0)
    consumers = list(q.consumers)
    extra: dict[str, Any] = {}
    if single:
        # A consumer whose client is on another worker (its channel a link to that
        # worker, with no connection here) is listed by its own worker.
        extra["consumer_details"] = [
            _consumer_json(c) for c in consumers if hasattr(c.channel, "conn")
        ]
        extra["deliveries"] = []  # per-channel figures: "basic" rates mode has none
        extra["incoming"] = []
    message_stats = stats.to_json(QUEUE_KEYS, by_side=True)
    if message_stats:
        extra["message_stats"] = message_stats
    if q.queue_type == "classic":
        extra["backing_queue_status"] = _backing_queue_status(ready)
    if q.queue_type == "stream":  # Leveret: the offsets a reader can start from
        extra["stream_first_offset"] = q.log.first
        extra["stream_next_offset"] = q.log.next
    doc = {
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
        "message_bytes": ready_bytes,
        "message_bytes_ready": ready_bytes,
        # Leveret keeps no per-queue sum of unacknowledged bytes: a stand-in
        # (docs/management.md#stand-ins).
        "message_bytes_unacknowledged": 0,
        "message_bytes_ram": ready_bytes,
        "message_bytes_persistent": q.persistent_bytes,
        "message_bytes_paged_out": 0,
        "messages_persistent": q.persistent,
        "messages_unacknowledged_ram": q.unacked,
        # As RabbitMQ's classic queues: ready messages kept as disk positions only
        # (a long queue's paged tail), and the rest, which are objects in RAM.
        "messages_paged_out": paged,
        "messages_ram": ready + q.unacked - paged,
        "messages_ready_ram": ready - paged,
        "exclusive_consumer_tag": next((c.tag for c in consumers if c.exclusive), None),
        "single_active_consumer_tag": None,
        # As RabbitMQ: the share of time consumers could take messages; a queue whose
        # consumers all have room counts as 1.0, none as 0.
        "consumer_capacity": 1.0 if consumers else 0,
        "consumer_utilisation": 1.0 if consumers else 0.0,
        "head_message_timestamp": None,
        "idle_since": idle_since(time.time()),
        "memory": 0,
        "recoverable_slaves": None,
        "effective_policy_definition": _effective_policy(vhost, q),
        "node": NODE,
        "state": "running",
        **process_stand_ins(),
        **vhost.policy_of("queue", q.name, q.queue_type),
        **extra,
    }
    if q.queue_type == "quorum":
        _quorum_fields(doc, q)
    return doc


# Fields RabbitMQ 3.10 shows for classic queues only.
_CLASSIC_ONLY = (
    "backing_queue_status",
    "exclusive_consumer_tag",
    "head_message_timestamp",
    "idle_since",
    "message_bytes_paged_out",
    "messages_paged_out",
    "messages_ready_ram",
    "messages_unacknowledged_ram",
    "recoverable_slaves",
    "single_active_consumer_tag",
)


def _quorum_fields(doc: dict[str, Any], q: Any) -> None:
    """A quorum queue's record, with RabbitMQ 3.10's keys: its Raft group is this node
    alone; every message is stored (persistent); `messages_dlx` are those waiting for
    at-least-once dead-lettering."""
    for key in _CLASSIC_ONLY:
        doc.pop(key, None)
    doc["leader"] = NODE
    doc["members"] = [NODE]
    doc["online"] = [NODE]
    doc["open_files"] = {NODE: 0}
    doc["messages_persistent"] = doc["messages"]
    doc["message_bytes_persistent"] = doc["message_bytes"]
    doc["messages_dlx"] = len(q.dead_lettering)
    doc["message_bytes_dlx"] = q.dead_lettering_bytes
    active = next((c for c in q.consumers if c.active), None)
    doc["single_active_consumer_ctag"] = (
        active.tag if active is not None and q.options.single_active_consumer else None
    )


def _backing_queue_status(ready: int) -> dict[str, Any]:
    """RabbitMQ's classic queue internals (its four in-memory queues and disk delta).
    Leveret's classic queue has none of them: a stand-in of the same shape that says
    every message is in one queue (docs/management.md#stand-ins)."""
    return {
        "mode": "default",
        "version": 1,
        "len": ready,
        "q1": 0,
        "q2": 0,
        "q3": 0,
        "q4": ready,
        "delta": ["delta", "undefined", 0, 0, "undefined"],
        "target_ram_count": "infinity",
        "next_seq_id": 0,
        "next_deliver_seq_id": 0,
        "avg_ingress_rate": 0.0,
        "avg_egress_rate": 0.0,
        "avg_ack_ingress_rate": 0.0,
        "avg_ack_egress_rate": 0.0,
    }


def _exchange_stats(x: Any, vhost: Any, workers: Any = None) -> dict[str, Any]:
    """An exchange's `message_stats`; in a broker of several workers (`workers`, the
    management/workers.py reports) every worker's counts and rates summed, since each
    worker routes (and counts) what its own clients publish."""
    if workers is None:
        return x.stats.to_json(EXCHANGE_KEYS)
    counts, rates = workers.exchange_counts(vhost.name, x.name)
    if not counts:
        return x.stats.to_json(EXCHANGE_KEYS)
    own_rates = x.stats.rates
    all_rates = [own_rates, *rates] if own_rates else rates
    summed = tuple(map(sum, zip(*all_rates, strict=True))) if all_rates else None
    return message_stats_json(total([x.stats, *counts]), summed, EXCHANGE_KEYS)


def _exchange_json(vhost: Any, x: Any, single: bool = False, workers: Any = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"incoming": [], "outgoing": []} if single else {}
    return {
        **extra,
        "user_who_performed_action": x.declared_by,
        "name": x.name,
        "vhost": vhost.name,
        "type": x.type_name,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": definitions_json._jsonable(x.arguments),
        **x.router.info(),  # the delayed exchange's messages_delayed
        **({"message_stats": stats} if (stats := _exchange_stats(x, vhost, workers)) else {}),
    }


#: what RabbitMQ lists of a queue with `disable_stats=true`: its definition and place
QUEUE_BASICS = ("arguments", "auto_delete", "durable", "exclusive", "name", "node", "type", "vhost")


def _queue_basics(queue: Any) -> dict[str, Any]:
    full = _queue_json(queue.vhost, queue)
    # RabbitMQ's basic record says "live" for a queue process that is up
    return {**{k: full[k] for k in QUEUE_BASICS if k in full}, "state": "live"}


def _worker_queue_json(stats: Any, q: Any, single: bool = False) -> dict[str, Any]:
    """A queue of a broker of several workers (management/workers.py): its owner's
    view, with the owner's index as `worker`; a single queue's consumers are those
    of every worker's channels."""
    if isinstance(q, RemoteQueue):
        doc = stats.queue_json(q, single)
    else:
        doc = {**_queue_json(q.vhost, q, single), "worker": stats.index}
    if single and "consumer_details" in doc:
        doc["consumer_details"] = stats.consumer_details(q)
    return doc


async def list_queues(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else login_vhosts(request)
    queues = [q for v in vhosts for q in sorted(v.queues.values(), key=lambda q: q.name)]
    stats = worker_stats(request)
    if request.query.get("disable_stats") == "true":
        if stats is not None:
            return listing(request, queues, partial(_worker_queue_basics, stats), paginated=True)
        return listing(request, queues, _queue_basics, paginated=True)
    if stats is not None:
        return listing(request, queues, partial(_worker_queue_json, stats), paginated=True)
    return listing(request, queues, lambda q: _queue_json(q.vhost, q), paginated=True)


def _worker_queue_basics(stats: Any, queue: Any) -> dict[str, Any]:
    full = _worker_queue_json(stats, queue)
    state = "live" if full.get("state") != "down" else "down"
    return {**{k: full[k] for k in (*QUEUE_BASICS, "worker") if k in full}, "state": state}


async def get_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    stats = worker_stats(request)
    if stats is not None:
        return web.json_response(_worker_queue_json(stats, queue, single=True))
    return web.json_response(_queue_json(vhost, queue, single=True))


def _direct(fn: Any, *args: Any) -> Any:
    """A declare or delete as RabbitMQ's API makes them (a channel method run for the
    user): any refusal is 401 "Access refused."."""
    try:
        return fn(*args)
    except (AccessRefused, Denied):
        raise Denied("Access refused.") from None


async def _change(request: web.Request, op: tuple[Any, ...]) -> bool:
    """In a broker of several workers, make change `op` through the metadata writer
    (leveret.workers.metadata), answering once every worker has it; False in a broker
    of one process, where the handler changes the model itself."""
    meta = _broker(request).meta
    if meta is None:
        return False
    try:
        done = meta.submit(op)
        if isinstance(done, Awaitable):
            await done
    except (AccessRefused, Denied):
        raise Denied("Access refused.") from None
    return True


def _missing_vhost_for_put(request: web.Request) -> web.Response | None:
    """PUT into a vhost that does not exist: RabbitMQ's 404 body differs from GET's."""
    if request.match_info["vhost"] not in _broker(request).vhosts:
        return error(404, "not_found", "vhost_not_found")
    return None


def _not_locked(queue: Any, vhost: Any) -> None:
    """An exclusive queue belongs to its connection: the API may not delete or purge it
    (RabbitMQ's RESOURCE_LOCKED, as a 400)."""
    if getattr(queue, "exclusive_owner", None) is not None:
        raise InvalidValue(
            f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
            f"'{vhost.name}'. It could be originally declared on another connection or "
            "the exclusive property value does not match that of the original declaration."
        )


def _absent(queue: Any, exc: NotFound) -> web.Response:
    """A queue of another worker that its owner could not act on: the owner is down
    (or no longer has it). RabbitMQ's API runs a delete or purge as a channel method
    and answers its channel error, 404 `not_found` with the error's text (for a
    durable queue whose home node is down, the text names the node); a transient
    queue went with its node, and is missing (404 Object Not Found)."""
    if not queue.durable:
        return not_found()
    return error(404, "not_found", str(exc))


async def delete_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    _not_locked(queue, vhost)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _direct(_access_check, guard.require, "configure", "queue", queue.name)
    described = f"queue '{queue.name}' in vhost '{vhost.name}'"
    meta = _broker(request).meta
    if meta is not None:  # the counts are the owner's
        try:
            messages, consumers = await meta.counts(queue)
        except NotFound as exc:
            return _absent(queue, exc)
    else:
        messages, consumers = queue.message_count, queue.consumer_count
    if request.query.get("if-empty") == "true" and messages:
        raise InvalidValue(f"{described} not empty")
    if request.query.get("if-unused") == "true" and consumers:
        raise InvalidValue(f"{described} in use")
    if not await _change(request, ("queue.delete", vhost.name, queue.name, None, None)):
        vhost.delete_queue(queue)
    return _ok()


async def purge_queue(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise NotFound(request.match_info["name"])
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _direct(_access_check, guard.require, "read", "queue", queue.name)
    _not_locked(queue, vhost)
    stats = worker_stats(request)
    if stats is not None and isinstance(queue, RemoteQueue):
        try:  # the owner's
            await stats.on_owner(queue, "api_purge", vhost.name, queue.name)
        except NotFound as exc:
            return _absent(queue, exc)
    else:
        vhost.purge_queue(queue)
    return _ok()


async def put_queue(request: web.Request) -> web.Response:
    if (missing := _missing_vhost_for_put(request)) is not None:
        return missing
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = request.match_info["name"]
    # As RabbitMQ (the API declares with AMQP's defaults): not durable unless asked.
    durable, auto_delete = _bool(body, "durable", False), _bool(body, "auto_delete", False)
    exclusive = body.get("exclusive", False)
    if not isinstance(exclusive, bool):
        # RabbitMQ's channel crashes on it (400 with the crash); the flag itself is
        # ignored: the API's connection would own the queue and end at once.
        raise InvalidValue(f"exclusive must be true or false, got {json.dumps(exclusive)}")
    arguments = definitions_json.json_arguments(_object(body, "arguments"))
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _direct(_access_check, guard.require, "configure", "queue", name)
    existed = name in vhost.queues
    meta = _broker(request).meta
    if meta is not None:
        op = meta.queue_declare_op(vhost.name, name, durable, auto_delete, arguments)
        try:
            await _change(request, op)
        except NotFound as exc:  # the owner is down: RabbitMQ's queue.declare's 404
            return error(404, "not_found", str(exc))
        return _ok(204 if existed else 201)
    # A declaration through the API is a client's: the vhost's default type applies.
    declare = partial(vhost.declare_queue, default_type=True)
    _direct(declare, name, False, durable, False, auto_delete, arguments)
    return _ok(204 if existed else 201)


class _Named:
    """An object and the name listing() pages by (exchanges know only their vhost's name)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value


def _exchange_from_named(workers: Any, named: _Named) -> dict[str, Any]:
    return _exchange_json(*named.value, workers=workers)


async def list_exchanges(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else login_vhosts(request)
    pairs = [(v, x) for v in vhosts for x in sorted(v.exchanges.values(), key=lambda x: x.name)]
    return listing(
        request,
        [_Named(x.name, (v, x)) for v, x in pairs],
        partial(_exchange_from_named, worker_stats(request)),
        paginated=True,
    )


async def get_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    exchange = vhost.exchanges.get(exchange_param(request))
    if exchange is None:
        raise NotFound(exchange_param(request))
    stats = worker_stats(request)
    doc = _exchange_json(vhost, exchange, single=True, workers=stats)
    if stats is not None and "messages_delayed" in doc:  # every worker delays its own
        doc["messages_delayed"] += await stats.delayed(vhost.name, exchange.name)
    return web.json_response(doc)


async def put_exchange(request: web.Request) -> web.Response:
    """As RabbitMQ (the API declares with AMQP's defaults): `{}` declares a direct
    exchange that is not durable."""
    if (missing := _missing_vhost_for_put(request)) is not None:
        return missing
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    name = exchange_param(request)
    kind = body.get("type", "direct")
    if not isinstance(kind, str):
        raise InvalidValue(f"exchange type must be a string, got {kind!r}")
    durable, auto_delete = _bool(body, "durable", False), _bool(body, "auto_delete", False)
    internal = _bool(body, "internal", False)
    arguments = definitions_json.json_arguments(_object(body, "arguments"))
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _direct(_access_check, guard.require, "configure", "exchange", name)
    existed = name in vhost.exchanges
    _direct(vhost.check_alternate_type, name, kind, arguments)
    op = (
        "exchange.declare",
        vhost.name,
        name,
        kind,
        durable,
        auto_delete,
        internal,
        arguments,
        request["user"].name,
    )
    if await _change(request, op):
        return _ok(204 if existed else 201)
    _direct(
        vhost.declare_exchange,
        name,
        kind,
        False,
        durable,
        auto_delete,
        internal,
        arguments,
        request["user"].name,
    )
    return _ok(204 if existed else 201)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    name = exchange_param(request)
    if name not in vhost.exchanges:
        raise NotFound(name)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        _direct(_access_check, guard.require, "configure", "exchange", name)
    if_unused = request.query.get("if-unused") == "true"
    if not await _change(request, ("exchange.delete", vhost.name, name, if_unused)):
        _direct(vhost.delete_exchange, name, if_unused)
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
    """RabbitMQ's name for one binding in a URL: the routing key form-encoded (a space
    is `+`, `~` is `%7E`), then `~` and a hash of the arguments if it has any; `~`
    alone for an empty key without arguments."""
    if not arguments:
        return _quote_key(routing_key) if routing_key else "~"
    return f"{_quote_key(routing_key)}~{_arguments_hash(arguments)}"


def _quote_key(routing_key: str) -> str:
    return quote_plus(routing_key, safe="").replace("~", "%7E")


def _arguments_hash(arguments: dict[str, Any]) -> str:
    """Names a binding's arguments in its properties key. RabbitMQ hashes the Erlang
    term (erlang:phash2); this hash differs, so a key with arguments is Leveret's own
    (listings give it, and fetching by it works). It hashes the binding's identity, wire
    types included, so two bindings that differ only in an integer's type (RabbitMQ
    keeps both) have two keys, as in RabbitMQ."""
    digest = hashlib.sha1(arguments_key(arguments).encode("latin-1")).digest()
    return base64.urlsafe_b64encode(digest[:8]).decode().rstrip("=")


def _parse_properties_key(props: str) -> tuple[str, str | None] | None:
    """(routing key, arguments hash or None) of a properties key from a URL, read as
    RabbitMQ reads it: split at the first `~`, each part form-decoded, so `with+space`
    and `with%20space` both name the key `with space`. None: more than one `~`."""
    key, _, rest = props.partition("~")
    if "~" in rest:
        return None
    return unquote_plus(key), (unquote_plus(rest) if rest else None)


def _default_binding(vhost: Any, queue: Any) -> dict[str, Any]:
    """Every queue's implicit binding from the default exchange, as RabbitMQ lists it."""
    return {
        "source": "",
        "vhost": vhost.name,
        "destination": queue.name,
        "destination_type": "queue",
        "routing_key": queue.name,
        "arguments": {},
        "properties_key": queue.name,
    }


def _all_bindings(vhost: Any) -> list[dict[str, Any]]:
    """A vhost's bindings as RabbitMQ lists them: the default exchange's first."""
    out = [_default_binding(vhost, q) for q in sorted(vhost.queues.values(), key=lambda q: q.name)]
    for x in sorted(vhost.exchanges.values(), key=lambda x: x.name):
        if x.name:
            out += [_binding_json(vhost, b) for b in x.bindings.values()]
    return out


def _empty_if_missing(request: web.Request) -> Any:
    """Binding lists of an exchange, a queue or a pair: RabbitMQ answers [] (not 404)
    when the vhost or an object does not exist."""
    name = request.match_info["vhost"]
    if name not in _broker(request).vhosts:
        return None
    return _vhost(request)


async def queue_bindings(request: web.Request) -> web.Response:
    """A queue's bindings, its implicit one from the default exchange first (as RabbitMQ)."""
    vhost = _empty_if_missing(request)
    name = request.match_info["name"]
    queue = vhost.queues.get(name) if vhost is not None else None
    if queue is None:
        # RabbitMQ lists the default exchange's binding even for a queue that does not
        # exist (it makes that one up from the name).
        named = _Named(name, None)
        return listing(request, [_default_binding(vhost, named)] if vhost is not None else [])
    explicit = sorted(queue.bindings, key=lambda b: (b.source.name, b.routing_key))
    return listing(
        request, [_default_binding(vhost, queue), *(_binding_json(vhost, b) for b in explicit)]
    )


async def exchange_bindings(request: web.Request) -> web.Response:
    """Bindings with this exchange as their source, or (…/destination) as their destination."""
    vhost = _empty_if_missing(request)
    exchange = vhost.exchanges.get(exchange_param(request)) if vhost is not None else None
    if exchange is None:
        return listing(request, [])
    if request.match_info["side"] == "source":
        found = list(exchange.bindings.values())
    else:
        found = list(exchange.inbound)
    found.sort(key=lambda b: (b.source.name, b.destination.name, b.routing_key))
    return listing(request, [_binding_json(vhost, b) for b in found])


async def list_bindings(request: web.Request) -> web.Response:
    vhosts = [_vhost(request)] if "vhost" in request.match_info else login_vhosts(request)
    return listing(request, [b for v in vhosts for b in _all_bindings(v)])


def _binding_ends(request: web.Request, post: bool = False) -> tuple[Any, Any, Any]:
    vhost = _vhost(request)
    source_name = exchange_param(request, "source")
    source = vhost.exchanges.get(source_name)
    kind = request.match_info["kind"]
    name = request.match_info["destination"]
    dest = (vhost.queues if kind == "q" else vhost.exchanges).get(name)
    if kind not in ("q", "e"):
        raise NotFound(name)
    if post and source is None:
        raise _not_found(f"no exchange '{source_name}' in vhost '{vhost.name}'")
    if post and dest is None:
        what = "queue" if kind == "q" else "exchange"
        raise _not_found(f"no {what} '{name}' in vhost '{vhost.name}'")
    if source is None or dest is None:
        raise NotFound(name)
    return vhost, source, dest


def _not_found(reason: str) -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text=json.dumps({"error": "not_found", "reason": reason}), content_type="application/json"
    )


async def bindings_between(request: web.Request) -> web.Response:
    try:
        vhost, source, dest = _binding_ends(request)
    except NotFound:
        return web.json_response([])
    return listing(
        request,
        [_binding_json(vhost, b) for b in source.bindings.values() if b.destination is dest],
    )


async def post_binding(request: web.Request) -> web.Response:
    if (missing := _missing_vhost_for_put(request)) is not None:
        return missing
    vhost, source, dest = _binding_ends(request, post=True)
    body = _body_dict(await read_json(request))
    key = body.get("routing_key", "")
    if isinstance(key, int | float) and not isinstance(key, bool):
        key = str(key)  # RabbitMQ takes a number as its text
    arguments = definitions_json.json_arguments(_object(body, "arguments"))
    if not isinstance(key, str):
        raise InvalidValue(f"routing_key must be a string, got {json.dumps(key)}")
    guard = _permission_guard(request, vhost)
    if guard is not None:
        kind = "queue" if request.match_info["kind"] == "q" else "exchange"
        _direct(_access_check, guard.require, "write", kind, dest.name)
        _direct(_access_check, guard._check_source, source.name, key)
    to_queue = request.match_info["kind"] == "q"
    op = ("bind", vhost.name, source.name, dest.name, to_queue, key, arguments, None)
    if not await _change(request, op):
        _direct(vhost.bind, source, dest, key, arguments)
    response = _ok(201)
    # The properties key URL-encoded once more, as RabbitMQ's Location has it.
    props = quote(_properties_key(key, arguments), safe="")
    response.headers["Location"] = f"{quote(dest.name, safe='')}/{props}"
    return response


def _binding_by_props(request: web.Request) -> tuple[Any, Any, Any, Any]:
    vhost, source, dest = _binding_ends(request)
    props = request.match_info["props"]
    parsed = _parse_properties_key(props)
    if parsed is None:
        raise NotFound(props)
    routing_key, hashed = parsed
    for b in list(source.bindings.values()):
        if b.destination is not dest or b.routing_key != routing_key:
            continue
        if (hashed is None and not b.arguments) or (
            hashed is not None and b.arguments and _arguments_hash(b.arguments) == hashed
        ):
            return vhost, source, dest, b
    raise NotFound(props)


async def get_binding(request: web.Request) -> web.Response:
    if exchange_param(request, "source") == "" and request.match_info["kind"] == "q":
        # The default exchange's implicit binding of a queue, keyed by the queue's name
        vhost, _source, dest = _binding_ends(request)
        parsed = _parse_properties_key(request.match_info["props"])
        if dest is None or parsed != (dest.name, None):
            raise NotFound(request.match_info["props"])
        return web.json_response(_default_binding(vhost, dest))
    vhost, _source, _dest, binding = _binding_by_props(request)
    return web.json_response(_binding_json(vhost, binding))


async def delete_binding(request: web.Request) -> web.Response:
    vhost, source, dest, b = _binding_by_props(request)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        kind = "queue" if request.match_info["kind"] == "q" else "exchange"
        _direct(_access_check, guard.require, "write", kind, dest.name)
        _direct(_access_check, guard._check_source, source.name, b.routing_key)
    to_queue = request.match_info["kind"] == "q"
    op = ("unbind", vhost.name, source.name, dest.name, to_queue, b.routing_key, b.arguments, None)
    if await _change(request, op):
        return _ok()
    _direct(
        vhost.unbind,
        source.name,
        dest.name,
        request.match_info["kind"] == "q",
        b.routing_key,
        b.arguments,
        None,
    )
    return _ok()


async def queue_actions(request: web.Request) -> web.Response:
    """POST .../actions {"action": "sync" | "cancel_sync"}: RabbitMQ's mirrored-queue
    synchronisation, for administrators. Leveret's classic queues have no mirrors, so
    both are done at once (RabbitMQ answers the same for an unmirrored queue)."""
    _require_admin(request)
    vhost = _vhost(request)
    body = _body_dict(await read_json(request))
    require_keys(body, ("action",))
    if vhost.queues.get(request.match_info["name"]) is None:
        raise NotFound(request.match_info["name"])  # RabbitMQ: 500
    if body["action"] not in ("sync", "cancel_sync"):
        raise bad_request("bad_request", ["unknown", body["action"]])
    return _ok()


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}", exchange_bindings)
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_queues)
    # RabbitMQ answers a list's path with a trailing slash as the list
    r.add_get("/api/queues/{vhost}/", list_queues)
    r.add_get("/api/exchanges/{vhost}/", list_exchanges)
    r.add_get("/api/bindings/{vhost}/", list_bindings)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_post("/api/queues/{vhost}/{name}/actions", queue_actions)
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
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", get_binding)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}", delete_binding)
