"""Overview, identity, definitions and health checks."""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from aiohttp import web

import leveret
from leveret.broker import definitions_json
from leveret.broker.errors import NotFound
from leveret.broker.exchanges import EXCHANGE_TYPES
from leveret.broker.queues.remote import RemoteQueue
from leveret.management import node_info
from leveret.management.app import SAMPLER_KEY, error, read_json
from leveret.management.routes.common import (
    NODE,
    RABBITMQ_VERSION,
    _access_check,
    _broker,
    _ok,
    _permission_guard,
    _require_admin,
    _server,
    _vhost,
    _visible_vhosts,
    bad_request,
    is_monitor,
    listing,
    require_monitor,
    vhosts_message_stats,
    worker_stats,
)
from leveret.server.alarms import resident_bytes


async def overview(request: web.Request) -> web.Response:
    server = _server(request)
    vhosts = _visible_vhosts(request)
    monitor = is_monitor(request)
    user = request["user"].name
    # Monitoring users see every connection; others their own (RabbitMQ's overview).
    stats = worker_stats(request)
    every = server.broker.client_connections()
    if stats is not None:  # the other workers' too
        every += stats.connections()
    connections = [
        c for c in every if c.vhost in vhosts and (monitor or getattr(c, "user", None) == user)
    ]
    # One pass over every queue: with 10,000 queues this is most of the call's time.
    n_queues = ready = unacked = consumers = 0
    ready_rate = unacked_rate = 0.0
    for v in vhosts:
        n_queues += len(v.queues)
        for q in v.queues.values():
            if q.__class__ is RemoteQueue:
                continue  # another worker's: its figures are in its report, added below
            ready += q.message_count
            unacked += q.unacked
            consumers += q.consumer_count
            rates = q.stats.depth_rates
            ready_rate += rates[0]
            unacked_rate += rates[1]
    if stats is not None:
        more = stats.queue_totals(vhosts)
        ready, unacked, consumers = ready + more[0], unacked + more[1], consumers + more[2]
        ready_rate, unacked_rate = ready_rate + more[3], unacked_rate + more[4]
    message_stats = vhosts_message_stats(request, vhosts)
    if message_stats:
        message_stats.update(_disk_stats(server))
    erlang_version, erlang_full_version = node_info.runtime_version()
    sampler = request.app[SAMPLER_KEY]
    body: dict[str, Any] = {
        "management_version": RABBITMQ_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": node_info.SAMPLE_RETENTION_POLICIES,
        "exchange_types": _exchange_types(),
        "product_version": leveret.__version__,
        "product_name": "Leveret",
        "rabbitmq_version": RABBITMQ_VERSION,
        "cluster_name": _broker(request).cluster_name,
        "erlang_version": erlang_version,
        "erlang_full_version": erlang_full_version,
        "release_series_support_status": "supported",
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": message_stats,
        "churn_rates": node_info.churn_json(server, sampler.churn_rates),
        "queue_totals": {}
        if not n_queues
        else {
            "messages": ready + unacked,
            "messages_details": {"rate": round(ready_rate + unacked_rate, 1)},
            "messages_ready": ready,
            "messages_ready_details": {"rate": round(ready_rate, 1)},
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": {"rate": round(unacked_rate, 1)},
        },
        "object_totals": {
            "channels": sum(len(c.channels) for c in connections),
            "connections": len(connections),
            "exchanges": sum(len(v.exchanges) for v in vhosts),
            "queues": n_queues,
        },
        "statistics_db_event_queue": 0,
    }
    if monitor:  # RabbitMQ shows the node and its listeners to monitoring users only
        body["object_totals"]["consumers"] = consumers
        body["node"] = NODE
        body["listeners"] = _listeners(server)
        body["contexts"] = node_info.contexts(server, NODE)
    return web.json_response(body)  # `columns` applies to every answer (app.py)


def _disk_stats(server: Any) -> dict[str, Any]:
    """The overview's disk_reads and disk_writes: messages the store read back and wrote."""
    hooks = server.broker.hooks
    stats = getattr(server, "worker_stats", None)
    out: dict[str, Any] = {}
    for key in ("disk_reads", "disk_writes"):
        out[key] = getattr(hooks, key, 0)
        if stats is not None:  # every worker's store
            out[key] = int(stats.counter(("store", key), out[key]))
        out[f"{key}_details"] = {"rate": 0.0}
    return out


def _listeners(server: Any) -> list[dict[str, Any]]:
    """RabbitMQ's listeners; `socket_opts` names the options Leveret sets on the socket."""
    out = [
        {
            "node": NODE,
            "protocol": "amqp",
            "ip_address": h,
            "port": p,
            "socket_opts": {"backlog": 128, "nodelay": True},
        }
        for h, p in server.addresses
    ]
    for protocol, http in (
        ("http", server.management),
        ("http/prometheus", getattr(server, "prometheus", None)),
    ):
        if http is not None:
            out.append(
                {
                    "node": NODE,
                    "protocol": protocol,
                    "ip_address": server.config.host,
                    "port": http.port,
                    "socket_opts": {"ip": server.config.host, "port": http.port},
                }
            )
    return out


def _exchange_types() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in sorted(EXCHANGE_TYPES):
        entry: dict[str, Any] = {"name": name, "description": "", "enabled": True}
        if name == "x-federation-upstream":
            entry["internal_purpose"] = "federation"  # as RabbitMQ lists it
        out.append(entry)
    return out


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _node_json(server: Any) -> dict[str, Any]:
    alarms = server.alarms
    active = alarms.active if alarms is not None else set()
    disk_free = 0
    try:
        st = os.statvfs(server.config.data_dir or ".")
        disk_free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    return {
        "name": NODE,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.monotonic() - server.started_at) * 1000),
        "processors": os.cpu_count() or 1,
        "mem_used": resident_bytes(),
        "mem_limit": alarms.memory_limit if alarms is not None else 0,
        "mem_alarm": "memory" in active,
        "disk_free": disk_free,
        "disk_free_limit": alarms.disk_free_limit if alarms is not None else 0,
        "disk_free_alarm": "disk" in active,
        "fd_used": _open_fds(),
        "fd_total": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "sockets_used": len(server.connections),
        "proc_used": len(server.connections),
        "rates_mode": "basic",
        "exchange_types": _exchange_types(),
        "partitions": [],
        "applications": [
            {"name": "leveret", "description": "Leveret", "version": leveret.__version__}
        ],
        **node_info.node_details(server, _churn_rates(server)),
    }


def _nodes(server: Any) -> list[dict[str, Any]]:
    """This node, or in a cluster every node (leveret.cluster adds running and leader).
    A node of several workers is all of them: their memory, descriptors and sockets
    add up (management/workers.py)."""
    doc = _node_json(server)
    stats = getattr(server, "worker_stats", None)
    if stats is not None:
        doc = stats.node_totals(doc)
    if server.cluster is not None:
        return server.cluster.api_nodes(doc)
    return [doc]


def _churn_rates(server: Any) -> tuple[float, ...] | None:
    sampler = getattr(server.management, "sampler", None)
    return sampler.churn_rates if sampler is not None else None


async def list_nodes(request: web.Request) -> web.Response:
    require_monitor(request)
    return listing(request, _nodes(_server(request)))


async def get_node(request: web.Request) -> web.Response:
    require_monitor(request)
    for node in _nodes(_server(request)):
        if node["name"] == request.match_info["node"]:
            return web.json_response(node)
    raise NotFound(request.match_info["node"])


async def node_healthcheck(request: web.Request) -> web.Response:
    """/api/healthchecks/node[/{node}]: the health check RabbitMQ 3.10 still serves for
    older probes (the /api/health/checks family replaces it). The node answers, so it
    is healthy; another node's name is a 404."""
    node = request.match_info.get("node", NODE)
    if node != NODE:
        raise NotFound(node)
    return web.json_response({"status": "ok"})


async def extensions(request: web.Request) -> web.Response:
    return web.json_response([])  # no UI plug-ins: the web UI is one page of its own


async def port_listener(request: web.Request) -> web.Response:
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise bad_request("bad_request", "Invalid port") from None
    server = _server(request)
    ports = sorted({listener["port"] for listener in _listeners(server)})
    if port in ports:
        return web.json_response({"status": "ok", "port": port})
    return web.json_response(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports},
        status=503,
    )


async def whoami(request: web.Request) -> web.Response:
    user = request["user"]
    return web.json_response({"name": user.name, "tags": list(user.tags)})


async def get_definitions(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None and vhost not in _broker(request).vhosts:
        raise bad_request("bad_request", "vhost_not_found")  # sic: 400, as RabbitMQ
    return web.json_response(definitions_json.export_definitions(_broker(request), vhost))


async def post_definitions(request: web.Request) -> web.Response:
    _require_admin(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None and vhost not in _broker(request).vhosts:
        return error(404, "not_found", "vhost_not_found")
    body = await read_json(request, "failed_to_parse_json")
    if not isinstance(body, dict):
        raise bad_request("bad_request", "failed_to_parse_json")  # as RabbitMQ: `[1, 2]`
    definitions_json.import_definitions(_broker(request), body, vhost, request["user"].name)
    return _ok()


async def alarms(request: web.Request) -> web.Response:
    server = _server(request)
    if server.alarms is not None and server.alarms.blocking:
        return web.json_response(
            {"status": "failed", "reason": f"resource alarm in effect: {server.alarms.reason}"},
            status=503,
        )
    return web.json_response({"status": "ok"})


async def virtual_hosts_health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def single_node_ok(request: web.Request) -> web.Response:
    """node-is-quorum-critical, node-is-mirror-sync-critical: one node is never critical."""
    return web.json_response({"status": "ok", "reason": "single node cluster"})


def _protocols(server: Any) -> list[str]:
    names = ["amqp"] if server.addresses else []
    if server.management is not None:
        names.append("http")
    if getattr(server, "prometheus", None) is not None:
        names.append("http/prometheus")
    if any(lst.kind == "amqps" for lst in server.config.effective_listeners()):
        names.append("amqp/ssl")
    return names


# RabbitMQ's aliases for a protocol name in protocol-listener checks.
_PROTOCOL_ALIASES = {
    "amqp091": "amqp",
    "amqp0-9-1": "amqp",
    "amqps": "amqp/ssl",
    "https": "https",
    "prometheus": "http/prometheus",
}


async def protocol_listener(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"].lower()
    name = _PROTOCOL_ALIASES.get(asked, asked)
    protocols = _protocols(_server(request))
    if name in protocols:
        return web.json_response({"status": "ok", "protocol": name})
    return web.json_response(
        {
            "status": "failed",
            "reason": "No active listener",
            "missing": asked,
            "protocols": protocols,
        },
        status=503,
    )


_UNITS = {"days": 1, "weeks": 7, "months": 30, "years": 365}


async def certificate_expiration(request: web.Request) -> web.Response:
    """Whether a TLS listener's certificate expires within the given time."""
    unit = request.match_info["unit"]
    if unit not in _UNITS:
        raise bad_request(
            "bad_request", "Time unit not recognised. Supported units: days, weeks, months, years."
        )
    try:
        within = int(request.match_info["within"])
    except ValueError:
        raise bad_request("bad_request", "Invalid expiration value.") from None
    server = _server(request)
    expiring = []
    deadline = time.time() + within * _UNITS[unit] * 86400
    for listener, not_after in _certificate_expiries(server):
        if not_after is not None and not_after <= deadline:
            expiring.append(listener)
    if expiring:
        return web.json_response(
            {"status": "failed", "reason": "Certificates expiring", "expired": expiring},
            status=503,
        )
    return web.json_response({"status": "ok"})


def _certificate_expiries(server: Any) -> list[tuple[dict[str, Any], float | None]]:
    """(listener, the certificate's notAfter) for each TLS listener."""
    import ssl

    config = server.config
    tls = [lst for lst in config.effective_listeners() if lst.kind == "amqps"]
    if not tls or not config.tls_cert:
        return []
    try:
        decoded = ssl._ssl._test_decode_cert(config.tls_cert)  # type: ignore[attr-defined]
        not_after: float | None = ssl.cert_time_to_seconds(decoded["notAfter"])
    except (OSError, KeyError, ValueError):
        not_after = None
    return [
        (
            {"node": NODE, "protocol": "amqp/ssl", "ip_address": lst.host, "port": lst.port},
            not_after,
        )
        for lst in tls
    ]


async def aliveness(request: web.Request) -> web.Response:
    """RabbitMQ declares a queue and publishes to it; the model is in this process, so
    a vhost that exists and answers here is alive."""
    vhost = _vhost(request)
    guard = _permission_guard(request, vhost)
    if guard is not None:
        # RabbitMQ declares, publishes to and reads a queue named aliveness-test.
        # Its refusal keeps the AMQP code in the text (it comes from a channel error).
        for what in ("configure", "write", "read"):
            _access_check(guard.require, what, "queue", "aliveness-test")
    return web.json_response({"status": "ok"})


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/definitions", get_definitions)
    r.add_post("/api/definitions", post_definitions)
    r.add_get("/api/definitions/{vhost}", get_definitions)
    r.add_post("/api/definitions/{vhost}", post_definitions)
    r.add_get("/api/nodes", list_nodes)
    r.add_get("/api/nodes/{node}", get_node)
    r.add_get("/api/extensions", extensions)
    r.add_get("/api/health/checks/port-listener/{port}", port_listener)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", alarms)
    r.add_get("/api/health/checks/virtual-hosts", virtual_hosts_health)
    r.add_get("/api/health/checks/node-is-quorum-critical", single_node_ok)
    r.add_get("/api/health/checks/node-is-mirror-sync-critical", single_node_ok)
    r.add_get("/api/health/checks/protocol-listener/{protocol}", protocol_listener)
    r.add_get("/api/health/checks/certificate-expiration/{within}/{unit}", certificate_expiration)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
    r.add_get("/api/healthchecks/node", node_healthcheck)
    r.add_get("/api/healthchecks/node/{node}", node_healthcheck)
