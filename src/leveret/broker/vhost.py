"""A virtual host: the namespace of exchanges and queues, and routing between them.

Model operations raise broker.errors (NotFound, PreconditionFailed, ...) with
RabbitMQ's reply texts; server.amqp_errors gives them their AMQP reply codes and
the channel layer the class and method ids, the management API its statuses.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from typing import Any

from leveret.broker.durability import DurabilityHooks
from leveret.broker.errors import (
    AccessRefused,
    LimitReached,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    UnknownType,
)
from leveret.broker.exchange import Binding, Exchange
from leveret.broker.exchanges import EXCHANGE_TYPES
from leveret.broker.message import Message
from leveret.broker.policies import Policy, effective_queue_arguments, winner
from leveret.broker.queue_args import (
    amqp_type_name,
    declared_type,
    foreign_argument,
    foreign_arguments,
    inequivalent_text,
    parse_queue_arguments,
    same_value,
)
from leveret.broker.queues import QUEUE_CLASSES, Queue, QueueEntry, check_new_queue, new_queue
from leveret.broker.queues.remote import RemoteQueue
from leveret.broker.stats import MessageStats, NodeCounters

STANDARD_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
# RabbitMQ's firehose tracer publishes to this internal exchange of every vhost while
# tracing is on. Leveret has no tracer: the exchange is there (as tools expect) and
# stays silent (docs/differences.md#http-trace-exchange).
TRACE_EXCHANGE = ("amq.rabbitmq.trace", "topic")
# Who made what the broker makes itself (RabbitMQ's name for it).
INTERNAL_USER = "rmq-internal"


# Queue arguments that must match on redeclaration (as RabbitMQ's equivalence check);
# a queue type with a list of its own has `equivalence_args` (streams, quorum queues).
EQUIVALENCE_ARGS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
)


def _default_type(queue: Queue, key: str, got: Any, current: Any) -> bool:
    """A classic queue's x-queue-type may be given as "classic" or left out, on either
    declaration (RabbitMQ 3.10; a stream's must be given each time)."""
    if key != "x-queue-type" or queue.queue_type != "classic":
        return False
    return (got is None or got == "classic") and (current is None or current == "classic")


def stored_remote(queue: Any) -> bool:
    """A queue another worker owns whose definition this worker keeps on disk too
    (durable, not exclusive, not server-named: what its owner stores), so that every
    worker's store holds the whole topology with each queue's owner."""
    return (
        type(queue) is RemoteQueue
        and queue.durable
        and queue.exclusive_owner is None
        and not queue.name.startswith("amq.gen-")
    )


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _check_equivalent(describe: str, *fields: tuple[str, str, str]) -> None:
    """406 for the first (name, received, current) that differs, in RabbitMQ's words."""
    for field, got, current in fields:
        if got != current:
            raise PreconditionFailed(
                f"inequivalent arg '{field}' for {describe}: "
                f"received '{got}' but current is '{current}'",
            )


class VirtualHost:
    def __init__(
        self,
        name: str = "/",
        hooks: DurabilityHooks | None = None,
        counters: NodeCounters | None = None,
    ) -> None:
        self.name = name
        self.hooks = hooks or DurabilityHooks()
        # The broker's node totals (Prometheus): deleted queues and dead-lettering.
        self.counters = counters if counters is not None else NodeCounters()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # Message counts of closed connections (broker.stats); open ones add their own.
        self.stats = MessageStats()
        self.churn = [0, 0, 0]  # queues declared, created, deleted (Prometheus)
        self.octets = [0, 0]  # bytes received and sent by its closed connections
        self.description = ""
        self.tags: list[str] = []
        # RabbitMQ's vhost limits: "max-connections", "max-queues" (absent: none).
        self.limits: dict[str, int] = {}
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        # Told (vhost, event, object) when exchanges, queues, bindings or policies change:
        # "exchange", "exchange-deleted", "queue", "queue-deleted", "bind", "unbind",
        # "policies". leveret.links follows them for federation; the broker's vhosts
        # share one list (admin). Never called per message.
        self.watchers: list[Callable[[VirtualHost, str, Any], None]] = []
        # The vhost metadata's default_queue_type (RabbitMQ 3.10): the type of queues
        # declared without x-queue-type; None: classic, with nothing added.
        self.default_queue_type: str | None = None
        # Quorum queues' delivery limit when none is declared or set by policy: a server
        # setting (RabbitMQ 4's default is 20); None: no limit, as in RabbitMQ 3.10.
        self.default_delivery_limit: int | None = None
        # How many of its queues store transient messages too (quorum queues): while
        # none does, a transient publish asks nothing more (server/publishing.py).
        self.persisting = 0
        # When the broker is one worker of several: the data path to queues other
        # workers own (broker.queues.remote.Crossing); None for a one-process broker.
        self.crossing: Any = None
        self.default_exchange = Exchange(name, "", "direct", durable=True)
        self.exchanges[""] = self.default_exchange
        for ex_name, ex_type in STANDARD_EXCHANGES:
            self.exchanges[ex_name] = Exchange(name, ex_name, ex_type, durable=True)
        ex_name, ex_type = TRACE_EXCHANGE
        self.exchanges[ex_name] = Exchange(name, ex_name, ex_type, durable=True, internal=True)

    # --- exchanges ----------------------------------------------------------

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        user: str = INTERNAL_USER,
    ) -> Exchange:
        """`user` made the declaration: a new exchange keeps it (the API's
        `user_who_performed_action`)."""
        if not name:
            raise AccessRefused("operation not permitted on the default exchange")
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
            return existing
        if type_name not in EXCHANGE_TYPES:
            raise UnknownType(f"unknown exchange type '{type_name}'")
        arguments = arguments or {}
        if existing is None:
            EXCHANGE_TYPES[type_name].validate_arguments(arguments)
            if name.startswith("amq."):
                raise AccessRefused(
                    f"exchange name '{name}' contains reserved prefix 'amq.*'",
                )
            exchange = Exchange(
                self.name, name, type_name, durable, auto_delete, internal, arguments
            )
            exchange.router.placed(self, exchange)
            exchange.declared_by = user
            exchange.router.attach(
                self.hooks.exchange_state_path(self.name, name) if durable else None
            )
            self.exchanges[name] = exchange
            if self.policies:
                policy = winner(self.policies, "exchange", name, "")
                if policy is not None:
                    exchange.policy_alternate = policy.definition.get("alternate-exchange")
            if durable:
                self.hooks.exchange_declared(exchange)
            if self.watchers:
                self._tell("exchange", exchange)
            return exchange
        _check_equivalent(
            existing.describe(),
            ("type", type_name, existing.type_name),
            ("durable", _flag(durable), _flag(existing.durable)),
            ("auto_delete", _flag(auto_delete), _flag(existing.auto_delete)),
            ("internal", _flag(internal), _flag(existing.internal)),
        )
        ae_new, ae_old = (
            arguments.get("alternate-exchange"),
            existing.arguments.get("alternate-exchange"),
        )
        if ae_new != ae_old:
            raise PreconditionFailed(
                inequivalent_text("alternate-exchange", existing.describe(), ae_new, ae_old)
            )
        return existing

    def check_alternate_type(self, name: str, type_name: str, arguments: dict[str, Any]) -> None:
        """A client (or the management API) may make an exchange only with an
        alternate-exchange that is a string: RabbitMQ refuses another type by name (a
        definitions import, which does not come here, takes any). An exchange that
        exists is only compared (declare_exchange); an unknown type or a reserved name
        is refused first, by declare_exchange, as in RabbitMQ."""
        if (
            "alternate-exchange" not in arguments
            or name in self.exchanges
            or type_name not in EXCHANGE_TYPES
            or name.startswith("amq.")
        ):
            return
        value = arguments["alternate-exchange"]
        if not isinstance(value, str | bytes):
            raise PreconditionFailed(
                f"invalid type '{amqp_type_name(value)}' for arg 'alternate-exchange' in "
                f"exchange '{name}' in vhost '{self.name}'"
            )

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if not name:
            raise AccessRefused("operation not permitted on the default exchange")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # idempotent, as RabbitMQ 3.x
        if name.startswith("amq.") and exchange in self._standard():
            raise AccessRefused(
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed",
            )
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"{exchange.describe()} in use")
        self._remove_exchange(exchange)

    def _standard(self) -> list[Exchange]:
        names = (*(n for n, _ in STANDARD_EXCHANGES), TRACE_EXCHANGE[0])
        return [self.exchanges[n] for n in names if n in self.exchanges]

    def _remove_exchange(self, exchange: Exchange) -> None:
        exchange.deleted = True
        exchange.router.detach()
        self.exchanges.pop(exchange.name, None)
        for binding in list(exchange.bindings.values()):
            self._drop_binding(binding, cascade=True)
        for binding in list(exchange.inbound):
            self._drop_binding(binding, cascade=True)
        if exchange.durable:
            self.hooks.exchange_deleted(exchange)
        if self.watchers:
            self._tell("exchange-deleted", exchange)

    # --- queues -------------------------------------------------------------

    def new_queue_name(self) -> str:
        while True:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            if name not in self.queues:
                return name

    def get_queue(self, name: str, connection: Any = None) -> Queue:
        """The named queue, checking exclusive ownership against `connection`."""
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
        if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
            raise self._locked(queue)
        return queue

    @staticmethod
    def _locked(queue: Queue) -> ResourceLocked:
        return ResourceLocked(
            f"cannot obtain exclusive access to locked {queue.describe()}. It could be "
            "originally declared on another connection or the exclusive property value "
            "does not match that of the original declaration.",
        )

    def declare_queue(
        self,
        name: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        connection: Any = None,
        server_named: bool = False,
        default_type: bool = False,
        worker: int | None = None,
    ) -> Queue:
        """Declare a queue; `server_named` marks a name this broker generated (amq.gen-*);
        `default_type`: a client's queue.declare (AMQP or the management API), which gets
        the vhost's default queue type as RabbitMQ's channel gives it (a definitions
        import or a restart declares what was stored, as it is). `worker`: in a broker
        of several workers, the one that owns a new queue when it is not this one (a
        RemoteQueue stands for it here); None: this worker.

        In RabbitMQ's order: the vhost's default queue type, the server-named check, then
        an existing queue is compared (its type's arguments only, not validated again),
        and a new one has its arguments checked, its own type's first."""
        arguments = arguments or {}
        if passive:
            return self.get_queue(name, connection)
        self.churn[0] += 1
        if default_type and self.default_queue_type and "x-queue-type" not in arguments:
            arguments = self._with_default_type(arguments, durable, exclusive, auto_delete)
        queue_type = declared_type(arguments)
        cls = QUEUE_CLASSES.get(queue_type)
        if (server_named or not name) and not getattr(cls, "server_named_ok", True):
            # First, as RabbitMQ's channel checks it (before the name or the arguments).
            raise PreconditionFailed(
                f"Cannot declare a server-named queue for type {cls.type_module}"  # type: ignore[union-attr]
            )
        existing = self.queues.get(name) if name else None
        if existing is not None:
            # As RabbitMQ: a redeclaration is compared with the queue (equivalence),
            # not validated again ("x-queue-type: bogus" is inequivalent, not invalid).
            self.get_queue(name, connection)  # exclusivity check
            if exclusive and existing.exclusive_owner is None:
                raise self._locked(existing)  # RabbitMQ's strict check on redeclaration
            _check_equivalent(
                existing.describe(),
                ("durable", _flag(durable), _flag(existing.durable)),
                ("auto_delete", _flag(auto_delete), _flag(existing.auto_delete)),
            )
            # (a queue another worker owns compares as its type does)
            kind = QUEUE_CLASSES.get(existing.queue_type) if type(existing) is RemoteQueue else None
            for key in getattr(kind or existing, "equivalence_args", EQUIVALENCE_ARGS):
                got_arg, cur_arg = arguments.get(key), existing.arguments.get(key)
                if not same_value(got_arg, cur_arg) and not _default_type(
                    existing, key, got_arg, cur_arg
                ):
                    raise PreconditionFailed(
                        inequivalent_text(key, existing.describe(), got_arg, cur_arg),
                    )
            existing.touch()
            return existing
        describe = f"queue '{name}' in vhost '{self.name}'"
        options = parse_queue_arguments(arguments, describe)
        foreign = foreign_arguments(queue_type, arguments)
        if foreign and not self.hooks.recovering:
            # (A queue an older build stored with them is restored as it was.)
            raise foreign_argument(foreign[0], describe, queue_type)
        if not name:
            name = self.new_queue_name()
        elif name.startswith("amq.") and not server_named:
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        limit = self.limits.get("max-queues")
        if limit is not None and len(self.queues) >= limit:
            raise LimitReached(
                f"cannot declare queue '{name}': queue limit in vhost '{self.name}' "
                f"({limit}) is reached",
            )
        merged = arguments
        if self.policies or self.operator_policies:
            merged = self.effective_arguments(name, arguments)
            options = parse_queue_arguments(merged, f"queue '{name}' in vhost '{self.name}'")
        owner = connection if exclusive else None
        if worker is None:
            queue = new_queue(self, name, durable, owner, auto_delete, arguments, options)
        else:
            check_new_queue(self, name, durable, owner, auto_delete, arguments)
            queue = RemoteQueue(self, name, worker, durable, owner, auto_delete, arguments, options)
        if merged is not arguments:
            queue.apply_policy(merged, options)
        self.queues[name] = queue
        if queue.persists_all:
            self.persisting += 1
        self.churn[1] += 1
        queue.touch()
        # Every queue is bound to the default exchange by its name (implicitly).
        if queue.stores_messages or (worker is not None and stored_remote(queue)):
            self.hooks.queue_declared(queue)
        if self.watchers:
            self._tell("queue", queue)
        return queue

    def _with_default_type(
        self, arguments: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool
    ) -> dict[str, Any]:
        """RabbitMQ 3.10's `default_queue_type` of the vhost: a declaration that names no
        type gets it, if that type can take the declaration (quorum queues and streams
        only durable, non-exclusive, non-auto-delete ones); others stay classic."""
        default = self.default_queue_type
        if default != "classic" and (not durable or exclusive or auto_delete):
            return arguments
        return {**arguments, "x-queue-type": default}

    # --- policies -------------------------------------------------------------

    def set_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
        operator: bool = False,
    ) -> Policy:
        """Add or replace a policy (PolicyError if invalid); it is stored, then applied at once."""
        policy = Policy(name, pattern, definition, priority, apply_to, operator)
        kind = "operator_policy" if operator else "policy"
        self.hooks.catalog_put(
            kind, self._policy_key(name), {"vhost": self.name, **policy.record()}
        )
        (self.operator_policies if operator else self.policies)[name] = policy
        self.apply_policies()
        return policy

    def clear_policy(self, name: str, operator: bool = False) -> None:
        """Remove a policy; what it set falls back to the arguments and other policies."""
        policies = self.operator_policies if operator else self.policies
        if name not in policies:
            what = "operator policy" if operator else "policy"
            raise NotFound(f"{what} '{name}' does not exist in vhost '{self.name}'")
        self.hooks.catalog_delete(
            "operator_policy" if operator else "policy", self._policy_key(name)
        )
        del policies[name]
        self.apply_policies()

    def set_operator_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "queues",
    ) -> Policy:
        return self.set_policy(name, pattern, definition, priority, apply_to, operator=True)

    def clear_operator_policy(self, name: str) -> None:
        self.clear_policy(name, operator=True)

    def _policy_key(self, name: str) -> str:
        return json.dumps([self.name, name])

    def effective_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A queue's arguments merged with the policy and operator policy that match it."""
        if not self.policies and not self.operator_policies:
            return arguments
        queue_type = declared_type(arguments)
        policy = winner(self.policies, "queue", name, queue_type)
        operator = winner(self.operator_policies, "queue", name, queue_type)
        cls = QUEUE_CLASSES.get(queue_type)
        policy_wins = cls.policy_wins if cls is not None else ()
        return effective_queue_arguments(arguments, policy, operator, policy_wins)

    def update_queue_arguments(self, queue: Queue, arguments: dict[str, Any]) -> None:
        """Replace a queue's declared arguments in place (the MQTT plugin sets a session
        queue's x-expires anew when the client changes its session expiry): they take
        effect at once, merged with the policies, and are stored with the queue."""
        queue.arguments = arguments
        merged = self.effective_arguments(queue.name, arguments)
        queue.apply_policy(merged, parse_queue_arguments(merged, queue.describe()))
        if queue.stores_messages:
            self.hooks.queue_declared(queue)

    def apply_policies(self) -> None:
        """Policies changed: every queue and exchange takes its new settings at once."""
        for queue in list(self.queues.values()):
            if queue.deleted:
                continue
            merged = self.effective_arguments(queue.name, queue.arguments)
            options = parse_queue_arguments(merged, queue.describe())
            queue.apply_policy(merged, options)
        for exchange in self.exchanges.values():
            if exchange.name:
                policy = winner(self.policies, "exchange", exchange.name, "")
                ae = policy.definition.get("alternate-exchange") if policy else None
                exchange.policy_alternate = ae
        if self.watchers:
            self._tell("policies", None)

    def _tell(self, event: str, subject: Any) -> None:
        for watcher in list(self.watchers):
            watcher(self, event, subject)

    def policy_of(self, kind: str, name: str, queue_type: str = "classic") -> dict[str, Any]:
        """The names of the policies that apply (for listings): policy, operator_policy."""
        policy = winner(self.policies, kind, name, queue_type)
        operator = (
            winner(self.operator_policies, kind, name, queue_type) if kind == "queue" else None
        )
        return {
            "policy": policy.name if policy else None,
            "operator_policy": operator.name if operator else None,
        }

    def delete_queue(self, queue: Queue, reason: str = "deleted") -> int:
        """Remove a queue, cancel its consumers, and return how many messages it held."""
        if queue.deleted:
            return 0
        if type(queue) is RemoteQueue:
            return self._delete_remote(queue)
        queue.deleted = True
        if queue.persists_all:
            self.persisting -= 1
        queue.stop_timers()
        self.queues.pop(queue.name, None)
        self.churn[2] += 1
        self.counters.queue_deleted(queue)
        count = len(queue.ready)
        for binding in list(queue.bindings):
            self._drop_binding(binding, cascade=True)
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
            consumer.channel.on_consumer_cancelled_by_broker(consumer)
        entries = queue.ready.clear()
        if queue.tracked:
            self.hooks.queue_deleted(queue, entries)
        queue.release()
        if self.watchers:
            self._tell("queue-deleted", queue)
        return count

    def _delete_remote(self, queue: RemoteQueue) -> int:
        """Remove the stand-in of a queue another worker owns (its messages are the
        owner's; the owner deletes them as it applies the same change)."""
        queue.deleted = True
        self.queues.pop(queue.name, None)  # (counted deleted by its owner: `churn`)
        for binding in list(queue.bindings):
            self._drop_binding(binding, cascade=True)
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
            consumer.channel.on_consumer_cancelled_by_broker(consumer)
        if stored_remote(queue):
            self.hooks.queue_deleted(queue, [])
        if self.watchers:
            self._tell("queue-deleted", queue)
        return 0

    def purge_queue(self, queue: Queue) -> int:
        # Counted first: a paged tail's messages are freed without an entry each.
        count = len(queue.ready)
        entries = queue.purge()
        if entries and queue.tracked:
            self.hooks.queue_purged(queue, entries)
        return count

    def on_message_removed(self, queue: Queue, entry: QueueEntry) -> None:
        # ClassicQueue.removed does the same for its own entries (compiled, in C).
        message = entry.message
        if message.persistent and queue.persistent:  # counted in by a durable queue
            queue.persistent -= 1
            queue.persistent_bytes -= message.size
        if queue.tracked:
            self.hooks.message_removed(queue, entry)
        if queue.dedup is not None:
            queue.dedup.forget(entry.message)

    def maybe_auto_delete(self, queue: Queue) -> None:
        """Auto-delete queues go when their last consumer does."""
        if queue.auto_delete and queue.had_consumer and not queue.consumers and not queue.deleted:
            self.delete_queue(queue)

    # --- bindings -----------------------------------------------------------

    def bind(
        self,
        source: Exchange,
        destination: Queue | Exchange,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        if source is self.default_exchange or destination is self.default_exchange:
            raise AccessRefused("operation not permitted on the default exchange")
        source.router.validate_binding(routing_key, arguments)
        binding = Binding(source, destination, routing_key, arguments)
        if source.add_binding(binding):
            if type(destination) is not Exchange:
                destination.bindings.add(binding)
            else:
                destination.inbound.add(binding)
            if self._binding_is_durable(binding):
                self.hooks.binding_added(binding)
            if self.watchers:
                self._tell("bind", binding)

    def unbind(
        self,
        source_name: str,
        destination_name: str,
        to_queue: bool,
        routing_key: str,
        arguments: dict[str, Any],
        connection: Any = None,
    ) -> None:
        """Remove a binding named by its ends; idempotent, as in RabbitMQ.

        Takes names rather than objects because unbinding something that is gone
        (the queue, the source or the destination exchange) succeeds: teardown code
        such as aio-pika's RPC pattern unbinds after the queue was auto-deleted.
        """
        if not source_name or (not to_queue and not destination_name):
            raise AccessRefused("operation not permitted on the default exchange")
        source = self.exchanges.get(source_name)
        if to_queue:
            if destination_name not in self.queues:
                return
            destination: Queue | Exchange = self.get_queue(destination_name, connection)
        else:
            dest_exchange = self.exchanges.get(destination_name)
            if dest_exchange is None:
                return
            destination = dest_exchange
        if source is None:
            return
        binding = source.bindings.get((destination, routing_key, _args_key(arguments)))
        if binding is not None:
            self._drop_binding(binding, cascade=True)

    @staticmethod
    def _binding_is_durable(binding: Binding) -> bool:
        """Stored only when both ends survive a restart."""
        dest = binding.destination
        if type(dest) is not Exchange:
            return (
                binding.source.durable
                and (dest.stores_messages or stored_remote(dest))
                and bool(binding.source.name)
            )
        return binding.source.durable and dest.durable

    def _drop_binding(self, binding: Binding, cascade: bool) -> None:
        source, destination = binding.source, binding.destination
        source.remove_binding(destination, binding.routing_key, binding.arguments)
        if type(destination) is not Exchange:
            destination.bindings.discard(binding)
        else:
            destination.inbound.discard(binding)
        if self._binding_is_durable(binding):
            self.hooks.binding_removed(binding)
        if self.watchers:
            self._tell("unbind", binding)
        if cascade and source.auto_delete and not source.bindings and not source.deleted:
            self._remove_exchange(source)

    # --- routing (hot path) -------------------------------------------------

    def route(
        self, exchange: Exchange, message: Message, routing_key: str | None = None
    ) -> list[Queue]:
        """Every queue the message goes to, following e2e bindings and alternate exchanges."""
        if routing_key is None:
            routing_key = message.routing_key
        if exchange is self.default_exchange:
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        queues = self._route_once(exchange, message, routing_key)
        if queues or (not exchange.arguments and exchange.policy_alternate is None):
            return queues
        # Unroutable: follow the alternate-exchange chain, each exchange once.
        seen = {exchange}
        current = exchange
        while not queues:
            ae_name = current.alternate_exchange
            ae = self.exchanges.get(ae_name) if ae_name is not None else None
            if ae is None or ae in seen:
                break
            seen.add(ae)
            queues = (
                self.route(ae, message, routing_key)
                if ae is self.default_exchange
                else (self._route_once(ae, message, routing_key))
            )
            current = ae
        return queues

    def route_keys(self, exchange: Exchange, message: Message, keys: list[str]) -> list[Queue]:
        """Routing with several keys (CC/BCC headers, dead-lettering): the union, deduplicated."""
        if len(keys) == 1:
            return self.route(exchange, message, keys[0])
        found: dict[Queue, None] = {}
        for key in keys:
            found.update(dict.fromkeys(self.route(exchange, message, key)))
        return list(found)

    def _route_once(self, exchange: Exchange, message: Message, routing_key: str) -> list[Queue]:
        queues: list[Queue] = []
        nested = None
        for dest in exchange.router.route(routing_key, message):
            if type(dest) is not Exchange:
                queues.append(dest)
            else:
                nested = nested or []
                nested.append(dest)
        if nested:
            # Exchange-to-exchange: walk each exchange once, dedup queues.
            seen_ex = {exchange}
            seen_q = set(queues)
            while nested:
                ex = nested.pop()
                if ex in seen_ex:
                    continue
                seen_ex.add(ex)
                for dest in ex.router.route(routing_key, message):
                    if type(dest) is not Exchange:
                        if dest not in seen_q:
                            seen_q.add(dest)
                            queues.append(dest)
                    elif dest not in seen_ex:
                        nested.append(dest)
        return queues


def _args_key(arguments: dict[str, Any]) -> str:
    from leveret.broker.exchange import arguments_key

    return arguments_key(arguments)
