"""Helpers every route module shares: the request's broker, vhost visibility, body checks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from leveret.broker.errors import InvalidValue, NotFound
from leveret.broker.stats import message_stats_json, total, vhost_counts
from leveret.management.app import SAMPLER_KEY, SERVER_KEY, Denied
from leveret.management.columns import parse_columns, select_columns
from leveret.protocol.constants import ACCESS_REFUSED as ACCESS_REFUSED_CODE
from leveret.protocol.constants import NOT_FOUND as NOT_FOUND_CODE
from leveret.protocol.errors import AMQPError
from leveret.server.authorization import Guard

RABBITMQ_VERSION = "3.10.8"  # the API version Leveret follows
NODE = "leveret@localhost"  # the one node's name, where RabbitMQ's JSON names a node


def _server(request: web.Request) -> Any:
    return request.app[SERVER_KEY]


def worker_stats(request: web.Request) -> Any:
    """The other workers' reports (management/workers.py); None on a one-process broker."""
    return getattr(_server(request), "worker_stats", None)


def _broker(request: web.Request) -> Any:
    return _server(request).broker


def _admin(request: web.Request) -> Any:
    return _broker(request).admin


def _tags(request: web.Request) -> set[str]:
    return set(request["user"].tags)


def is_admin(request: web.Request) -> bool:
    return "administrator" in _tags(request)


def is_monitor(request: web.Request) -> bool:
    """RabbitMQ's is_monitor: monitoring or administrator."""
    return bool({"administrator", "monitoring"} & _tags(request))


def _require_admin(request: web.Request) -> None:
    if not is_admin(request):
        raise Denied("Not administrator user")


def require_monitor(request: web.Request) -> None:
    """Node views (/api/nodes): RabbitMQ's is_authorized_monitor."""
    if not is_monitor(request):
        raise Denied("Not monitor user")


def require_policymaker(request: web.Request) -> Any:
    """A policy (or parameter): administrators, or policymakers with access to its vhost
    (RabbitMQ's is_authorized_policies)."""
    name = request.match_info["vhost"]
    vhost = _broker(request).vhosts.get(name)
    if is_admin(request):
        if vhost is None:
            raise NotFound(name)
        return vhost
    if "policymaker" not in _tags(request) or (
        vhost is not None and not _may_log_in(request, vhost)
    ):
        raise Denied("User not authorised to access object")
    if vhost is None:
        raise NotFound(name)
    return vhost


def _may_log_in(request: web.Request, vhost: Any) -> bool:
    return _broker(request).access.permission(request["user"].name, vhost.name) is not None


def _visible_vhosts(request: web.Request) -> list[Any]:
    """Administrators and monitoring users see every vhost; others those they may use."""
    vhosts = sorted(_broker(request).vhosts.values(), key=lambda v: v.name)
    if is_monitor(request):
        return vhosts
    return [v for v in vhosts if _may_log_in(request, v)]


def login_vhosts(request: web.Request) -> list[Any]:
    """Administrators see every vhost; others, monitoring users too, those they may use
    (RabbitMQ's filter_vhost: the lists of queues, exchanges, bindings, policies)."""
    vhosts = sorted(_broker(request).vhosts.values(), key=lambda v: v.name)
    if is_admin(request):
        return vhosts
    return [v for v in vhosts if _may_log_in(request, v)]


def _vhost(request: web.Request, visible: bool = False) -> Any:
    """The URL's vhost, as RabbitMQ's is_authorized_vhost: administrators reach every
    vhost, other users those they have permissions in (401 "User not authorised to
    access virtual host"); a vhost that does not exist is 404. `visible`: monitoring
    users reach every vhost too (is_authorized_vhost_visible)."""
    name = request.match_info["vhost"]
    vhost = _broker(request).vhosts.get(name)
    if vhost is None:
        raise NotFound(name)
    if is_admin(request) or (visible and is_monitor(request)) or _may_log_in(request, vhost):
        return vhost
    raise Denied("User not authorised to access virtual host")


def vhosts_message_stats(request: web.Request, vhosts: list[Any]) -> dict[str, Any]:
    """RabbitMQ's message_stats for these vhosts together (channel side: publish, deliver,
    ack, ...), counts since start with the sampler's rates."""
    broker = _broker(request)
    names = {v.name for v in vhosts}
    conns: dict[str, list[Any]] = {name: [] for name in names}
    for conn in broker.connections:
        if conn.vhost is not None and conn.vhost.name in names:
            conns[conn.vhost.name].append(conn)
    counts = total(vhost_counts(v, conns[v.name]) for v in vhosts)
    sampler = request.app[SAMPLER_KEY]
    rates = total(sampler.vhost_rates[n] for n in names if sampler.vhost_rates.get(n))
    stats = worker_stats(request)
    if stats is not None:  # the other workers' channels
        more_counts, more_rates = stats.vhost_message_counts(names)
        counts = total([counts, *more_counts])
        rates = total([rates, *more_rates])
    # As RabbitMQ: the publishing side's keys and the delivering side's each once it moved.
    return message_stats_json(counts, rates, by_side=True)


def exchange_param(request: web.Request, key: str = "name") -> str:
    """An exchange name from the URL: RabbitMQ's API spells the default exchange
    `amq.default` there (its real name is the empty string)."""
    name = request.match_info[key]
    return "" if name == "amq.default" else name


def _ok(status: int = 204) -> web.Response:
    return web.Response(status=status)


def _strip_code(text: str) -> str:
    """'PRECONDITION_FAILED - inequivalent ...' → 'inequivalent ...' (RabbitMQ's API form)."""
    return text.partition(" - ")[2] or text


def _body_dict(body: Any) -> dict[str, Any]:
    if isinstance(body, str):  # RabbitMQ's own hint for the usual cause
        raise InvalidValue(
            "invalid payload: the request body JSON-decoded to a string. "
            "Is the input doubly-JSON-encoded?"
        )
    if not isinstance(body, dict):
        raise InvalidValue("the body must be a JSON object")
    return body


def require_keys(body: dict[str, Any], keys: tuple[str, ...]) -> None:
    """RabbitMQ's 400 for missing fields: "[{key_missing,a},{key_missing,b}]", broken
    over lines as Erlang prints a term longer than 80 characters."""
    missing = [f"{{key_missing,{k}}}" for k in keys if k not in body]
    if missing:
        one_line = "[" + ",".join(missing) + "]"
        raise InvalidValue(one_line if len(one_line) <= 80 else "[" + ",\n ".join(missing) + "]")


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    """An object field such as `arguments` (absent or null: empty). RabbitMQ crashes
    (500) on another type; Leveret names the field."""
    value = body.get(key)
    if value is None or value == []:  # RabbitMQ reads [] as an empty table
        return {}
    if not isinstance(value, dict):
        raise InvalidValue(f"{key} must be a JSON object, got {json.dumps(value)}")
    return value


def _string(body: dict[str, Any], key: str, default: str | None = None) -> str:
    """A string field; a missing one without default is RabbitMQ's 400 key_missing."""
    if key not in body:
        if default is None:
            require_keys(body, (key,))
        return default or ""
    value = body[key]
    if not isinstance(value, str):
        raise InvalidValue(f"{key} must be a string, got {json.dumps(value)}")
    return value


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    """RabbitMQ takes true/false and the strings "true"/"false" (rabbitmqadmin sends
    those); anything else is 400 with reason ["not_boolean", value]."""
    value = body.get(key, default)
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise bad_request("bad_request", ["not_boolean", value])


def _access_check(fn, *args, **kwargs):
    """Run a permission check of the AMQP front end (server.authorization), which raises
    AMQP errors; they become 401/404/400 bodies. Model operations raise broker.errors,
    which the middleware maps."""
    try:
        return fn(*args, **kwargs)
    except AMQPError as exc:
        if exc.code == NOT_FOUND_CODE:
            raise NotFound(exc.reply_text) from None
        if exc.code == ACCESS_REFUSED_CODE:
            # RabbitMQ's 401 keeps the channel error's name: "ACCESS_REFUSED - ...".
            raise Denied(exc.reply_text) from None
        raise InvalidValue(_strip_code(exc.reply_text)) from None


def _int(body: dict[str, Any], key: str, default: int) -> int:
    """An integer field; RabbitMQ also takes its decimal string (rabbitmqadmin sends
    those), and answers 400 ["not_integer", value] otherwise."""
    value = body.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise bad_request("bad_request", ["not_integer", value])


def _permission_guard(request: web.Request, vhost: Any) -> Any:
    """The AMQP choke point's Guard for the API user in this vhost (None: full access)."""
    access = _broker(request).access
    user = request["user"].name
    perm, topics = access.permission(user, vhost.name), access.topics(user, vhost.name)
    return Guard(user, vhost, perm, topics) if Guard.needed(perm, topics) else None


# --- listings: RabbitMQ's sort, columns and pagination parameters ---------------------------

PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 500


def bad_request(error: str, reason: Any) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": error, "reason": reason}), content_type="application/json"
    )


def _lookup(item: dict[str, Any], path: str) -> Any:
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    """Erlang's term order, which RabbitMQ sorts by: numbers < atoms (false, null, true)
    < objects < lists < strings; a missing field sorts as 0 (RabbitMQ's "nothing")."""
    if value is None:
        return (0, 0)  # missing: RabbitMQ's default is 0
    if isinstance(value, bool):
        return (1, str(value).lower())
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, dict):
        return (2, json.dumps(value, sort_keys=True))
    if isinstance(value, list):
        return (3, json.dumps(value, sort_keys=True))
    return (4, value.encode() if isinstance(value, str) else str(value).encode())


def listing(
    request: web.Request,
    items: list[Any],
    build: Callable[[Any], dict[str, Any]] | None = None,
    *,
    paginated: bool = False,
) -> web.Response:
    """A list answer with RabbitMQ's query parameters.

    `sort` (a dotted key) and `sort_reverse` order the list and `columns` trims
    each item, on every list. Only the lists RabbitMQ paginates (queues, exchanges,
    vhosts, connections, channels: `paginated`) take `page`, `page_size`, `name`
    and `use_regex`, and answer with RabbitMQ's page object, filtered by name (a
    case-insensitive substring or regular expression), and only when `page` is given.
    Other lists ignore those parameters, as RabbitMQ does; a malformed one is a 400
    there too (RabbitMQ crashes with a 500).

    With `build`, `items` are model objects with a `.name` and `build` makes each
    one's JSON: a page sorted by name then builds only the page's items, which
    keeps a paged /api/queues cheap with tens of thousands of queues.
    """
    query = request.query
    sort = query.get("sort")
    if build is not None:
        if sort and sort != "name":
            items, build = [build(i) for i in items], None
        elif sort == "name":
            items = sorted(items, key=lambda i: _sort_key(i.name))
    if build is None and sort:
        items = sorted(items, key=lambda item: _sort_key(_lookup(item, sort)))
    if query.get("sort_reverse") == "true":
        items = list(reversed(items))
    columns = parse_columns(query)

    def finish(chosen: list[Any]) -> list[Any]:
        if build is not None:
            chosen = [build(i) for i in chosen]
        return select_columns(chosen, columns)

    if "page" not in query:
        return web.json_response(finish(items))
    page, page_size = _page_numbers(query)
    if not paginated:
        return web.json_response(finish(items))
    total = len(items)
    name = query.get("name", "")
    if name:
        get_name = (lambda i: i.name) if build is not None else (lambda i: str(i.get("name", "")))
        if query.get("use_regex") == "true":
            try:
                pattern = re.compile(name, re.IGNORECASE)
            except re.error:
                raise bad_request("bad_request", "Pagination parameters are invalid") from None
            items = [i for i in items if pattern.search(get_name(i))]
        else:
            needle = name.lower()
            items = [i for i in items if needle in get_name(i).lower()]
    filtered = len(items)
    page_count = (filtered + page_size - 1) // page_size
    if (page - 1) * page_size > filtered:
        # RabbitMQ: the page may start just past the end (an empty page), no further.
        raise bad_request(
            "page_out_of_range",
            f"Page out of range, page: {page} page size: {page_size}, len: {filtered}",
        )
    chosen = finish(items[(page - 1) * page_size : page * page_size])
    return web.json_response(
        {
            "filtered_count": filtered,
            "item_count": len(chosen),
            "items": chosen,
            "page": page,
            "page_count": page_count,
            "page_size": page_size,
            "total_count": total,
        }
    )


def _page_numbers(query: Any) -> tuple[int, int]:
    try:
        page = int(query["page"])
        page_size = int(query.get("page_size", PAGE_SIZE_DEFAULT))
    except ValueError:
        raise bad_request("bad_request", "Pagination parameters are invalid") from None
    if page < 1 or not 1 <= page_size <= PAGE_SIZE_MAX:
        shown = query.get("page_size", "undefined")
        raise bad_request(
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, page size {shown}",
        )
    return page, page_size
