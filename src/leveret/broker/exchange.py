"""An exchange: its declared properties, its bindings, and its routing type."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from leveret.broker.exchanges import EXCHANGE_TYPES, ExchangeType
from leveret.broker.stats import MessageStats
from leveret.protocol.fieldtable import encode_decoded_value, join_table


def arguments_key(arguments: dict[str, Any]) -> str:
    """A hashable identity for a binding's arguments table: the table encoded with each
    value's wire type (protocol.fieldtable's typed numbers), its keys sorted. RabbitMQ
    keys a binding by its arguments with their types, so 7 sent as a signedint and 7
    sent as a long make two bindings, and an unbind removes only the one whose types
    match. A plain int (one that was never on the wire) counts as the signedint it is
    stored as."""
    if not arguments:
        return ""
    try:
        raw = join_table({k: encode_decoded_value(arguments[k]) for k in sorted(arguments)})
    except (TypeError, ValueError, OverflowError, struct.error):
        return repr(sorted(arguments.items()))  # a value no field table can hold
    return raw.decode("latin-1")


@dataclass(eq=False)
class Binding:
    source: Exchange
    destination: Any  # Queue or Exchange
    routing_key: str
    arguments: dict[str, Any]

    @property
    def key(self) -> tuple[Any, str, str]:
        return (self.destination, self.routing_key, arguments_key(self.arguments))


class Exchange:
    """Exchanges compare by identity: two with the same name never coexist in a vhost."""

    def __init__(
        self,
        vhost_name: str,
        name: str,
        type_name: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost_name = vhost_name
        self.name = name
        self.type_name = type_name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.router: ExchangeType = EXCHANGE_TYPES[type_name].for_exchange(self.arguments)
        # Bindings where this exchange is the source, keyed by Binding.key.
        self.bindings: dict[tuple[Any, str, str], Binding] = {}
        # Bindings where this exchange is the destination (exchange-to-exchange).
        self.inbound: set[Binding] = set()
        self.deleted = False
        self.policy_alternate: str | None = None  # alternate-exchange from a policy
        self.stats = MessageStats()
        # Who declared it (the API's user_who_performed_action); the broker's own
        # exchanges, and those restored from disk, say RabbitMQ's "rmq-internal".
        self.declared_by = "rmq-internal"

    @property
    def alternate_exchange(self) -> str | None:
        ae = self.arguments.get("alternate-exchange", self.policy_alternate)
        if isinstance(ae, bytes):
            ae = ae.decode(errors="replace")
        return ae if isinstance(ae, str) else None

    def add_binding(self, binding: Binding) -> bool:
        """Index the binding; False when an identical one already existed."""
        key = binding.key
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        self.router.bind(binding.destination, binding.routing_key, binding.arguments)
        return True

    def remove_binding(self, destination: Any, routing_key: str, arguments: dict) -> Binding | None:
        binding = self.bindings.pop((destination, routing_key, arguments_key(arguments)), None)
        if binding is not None:
            self.router.unbind(destination, routing_key, arguments)
        return binding

    def describe(self) -> str:
        return f"exchange '{self.name}' in vhost '{self.vhost_name}'"

    def __repr__(self) -> str:
        return f"<Exchange {self.name!r} {self.type_name}>"
