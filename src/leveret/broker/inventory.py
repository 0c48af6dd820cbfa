"""Rows describing what a vhost holds, for `leveret ctl list_*` (RabbitMQ's column names)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.vhost import VirtualHost


def queues(vhost: VirtualHost) -> list[dict[str, Any]]:
    return [
        {
            "name": q.name,
            "messages": q.message_count,
            "consumers": q.consumer_count,
            "type": q.queue_type,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "exclusive": q.exclusive_owner is not None,
        }
        for q in sorted(vhost.queues.values(), key=lambda q: q.name)
    ]


def exchanges(vhost: VirtualHost) -> list[dict[str, Any]]:
    return [
        {
            "name": x.name,
            "type": x.type_name,
            "durable": x.durable,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
        }
        for x in sorted(vhost.exchanges.values(), key=lambda x: x.name)
    ]


def bindings(vhost: VirtualHost) -> list[dict[str, Any]]:
    rows = []
    for q in sorted(vhost.queues.values(), key=lambda q: q.name):
        # The implicit binding of every queue to the default exchange, as rabbitmqctl lists it.
        rows.append(_binding_row("", q.name, "queue", q.name, {}))
    for x in sorted(vhost.exchanges.values(), key=lambda x: x.name):
        if not x.name:
            continue
        for b in x.bindings.values():
            kind = "exchange" if type(b.destination) is type(x) else "queue"
            rows.append(_binding_row(x.name, b.destination.name, kind, b.routing_key, b.arguments))
    return rows


def _binding_row(source: str, dest: str, kind: str, key: str, args: dict) -> dict[str, Any]:
    return {
        "source_name": source,
        "source_kind": "exchange",
        "destination_name": dest,
        "destination_kind": kind,
        "routing_key": key,
        "arguments": {k: str(v) for k, v in args.items()},
    }


def connections(broker: Broker, vhost: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for conn in broker.connections_of(vhost=vhost):
        props = getattr(conn, "client_properties", {}) or {}
        rows.append(
            {
                "name": getattr(conn, "peer", "?"),
                "user": conn.user,
                "vhost": conn.vhost.name if conn.vhost is not None else None,
                "channels": len(getattr(conn, "channels", {})),
                "client": str(props.get("product", "")),
                "connection_name": str(props.get("connection_name", "")),
            }
        )
    return sorted(rows, key=lambda r: r["name"])
