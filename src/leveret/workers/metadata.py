"""Metadata in a broker of several workers: one writer, every change everywhere in order.

Every worker holds the whole topology (exchanges, bindings, every queue: its own
queues as themselves, the others' as `RemoteQueue` stand-ins), so that routing,
passive declares and permission and exclusivity checks stay local. Changes have
one writer, worker 0 (`WRITER`):

- A client's change on worker k (exchange.declare, queue.declare, bind...) becomes
  an op, a small tuple (`Op`), sent with `mesh.call(0, "meta", op)`. Worker 0 applies
  it to its own model first: that is the validation, and an error (406 inequivalent,
  404, 403, 405) goes back to worker k's client as it would on one process, and
  nothing else happens. Applied, the op is numbered and sent (`link.Meta`) to every
  other worker that is in sync; each applies ops in number order with the same model
  code (so cascades, such as an auto-delete exchange losing its last binding, happen
  alike everywhere) and answers `link.MetaApplied`. Once every live worker applied
  it, worker 0 answers the call, and only then does worker k answer its client.
  Meanwhile worker k's connection holds its later events (server/connection.py,
  `hold_for`), so a declare followed by a publish on any worker finds the queue.
- A change the model makes by itself on a worker (an exclusive queue deleted with
  its connection, an auto-delete queue losing its last consumer, x-expires) is
  applied there first, then sent to worker 0 the same way, marked as made, and
  reaches the others from there.
- Placement: a new named queue is owned by `mesh.owner_of(vhost, name)`; an
  exclusive or server-named one by the declaring connection's worker. The owner is
  in the op, so every worker makes the same choice; it is stored with the queue's
  definition on every worker (store/definitions.py, `worker`) and kept on restart.
- A worker that (re)joins worker 0 syncs: it sends the queues it owns and holds in
  memory only (transient and exclusive ones, which worker 0 forgets when it restarts),
  worker 0 takes those it lacks, and answers with a snapshot of its topology and its
  op number. A worker's first sync with a (re)started worker 0 also brings the
  transient exchanges and unstored bindings it holds, which worker 0 takes unless it
  has them or deleted them since it started (`_take_exchanges`, `_take_bindings`).
  The worker reconciles its model to the snapshot (keeping the messages of the
  queues it owns) and applies ops from that number on. A sync that fails
  other than by a lost link is tried again with a capped backoff, and given up
  after `SYNC_TRIES` tries, or at once when worker 0 refuses it (`SyncRefused`):
  `sync_failures` hears of it (leveret.worker exits, its supervisor acts).

With `broker.mesh` None (one process) nothing here exists: the launcher makes a
`Metadata` only for a worker of several.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import pickle
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.broker import definitions_json
from leveret.broker.direct_reply import PSEUDO_QUEUE
from leveret.broker.errors import InvalidValue, NotFound, PreconditionFailed
from leveret.broker.exchange import Exchange, arguments_key
from leveret.broker.queues.remote import RemoteOwner, RemoteQueue
from leveret.broker.vhost import INTERNAL_USER
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    INTERNAL_ERROR,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_UNBIND,
)
from leveret.protocol.errors import ChannelError, ConnectionError_
from leveret.store import replica
from leveret.workers.link import META, META_APPLIED, Meta, MetaApplied
from leveret.workers.mesh import Mesh, PeerDown

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.vhost import VirtualHost

log = logging.getLogger("leveret.workers.metadata")

WRITER = 0  # the worker that writes metadata
MADE = "made"  # a bind's connection when worker 0's own model made it (MQTT)
WRITER_WAIT = 10.0  # seconds a change waits for worker 0 to be back (Metadata.writer_wait)
#: a sync with worker 0 that fails (other than by a lost link) is tried again after
#: SYNC_RETRY_FIRST seconds, doubling up to SYNC_RETRY_CAP; after SYNC_TRIES failures
#: in a row the worker gives up (`Metadata.sync_failures`): a fresh process, which
#: reads its store again, is what is left to try
SYNC_RETRY_FIRST = 0.1
SYNC_RETRY_CAP = 2.0
SYNC_TRIES = 8
#: A test hook (tests/workers/test_sync_retry.py): while this variable names a file,
#: each sync a follower starts reads it first: a number N > 0 makes this sync fail
#: (and leaves N - 1 in the file), `refuse` makes it fail as refused. Unset (always,
#: outside tests), nothing is read.
SYNC_FAULTS_ENV = "LEVERET_TEST_SYNC_FAULTS_FILE"


class SyncRefused(Exception):
    """Worker 0 refused a worker's sync for a reason that trying again cannot change
    (the two run as brokers of different worker counts): the broker cannot serve."""


#: a client connection as every worker names it: (its worker, its number there, its name)
ConnRef = tuple[int, int, str]
#: a metadata change: (kind, vhost, fields...) as `_apply` reads it
Op = tuple[Any, ...]


def worker_node(worker: int) -> str:
    """The node name a worker goes by in errors that name a queue's home node."""
    return f"leveret-{worker}@localhost"


def absent(vhost: str, name: str, worker: int, durable: bool) -> NotFound:
    """RabbitMQ's answer for a queue whose node is down (rabbit_amqqueue:absent/2):
    404, naming the node, for a durable queue; a transient one is gone with it."""
    if durable:
        return NotFound(
            f"home node '{worker_node(worker)}' of durable queue '{name}' in vhost "
            f"'{vhost}' is down or inaccessible"
        )
    return NotFound(f"no queue '{name}' in vhost '{vhost}'")


def writer_down() -> ConnectionError_:
    return ConnectionError_(
        INTERNAL_ERROR,
        f"the metadata writer (worker {WRITER}, {worker_node(WRITER)}) is down or "
        "inaccessible; metadata cannot change until it is back",
    )


#: the administrative changes (broker/admin.py's Admin, by method name) that worker 0
#: makes and sends on: each worker runs the same method with the same arguments
ADMIN_CHANGES = (
    "add_vhost",
    "delete_vhost",
    "set_vhost_limits",
    "clear_vhost_limits",
    "add_user",
    "delete_user",
    "change_password",
    "clear_password",
    "set_user_tags",
    "set_user_limits",
    "clear_user_limits",
    "set_permissions",
    "clear_permissions",
    "set_topic_permissions",
    "clear_topic_permissions",
    "set_policy",
    "clear_policy",
    "set_operator_policy",
    "clear_operator_policy",
)
#: the same for the global parameters (broker/global_parameters.py)
GLOBAL_PARAMETER_CHANGES = ("set", "clear")


def _args(table: Any) -> dict[str, Any]:
    return dict(table) if table else {}


class Metadata:
    """One worker's part in the metadata of a broker of several (see the module)."""

    def __init__(self, broker: Callable[[], Broker], mesh: Mesh) -> None:
        self._broker = broker  # the node's current broker (a store replaces it at start)
        self.mesh = mesh
        self.index = mesh.index
        # the writer's side
        self.seq = 0  # the number of the last op sent
        self.synced: set[int] = set()  # workers that took a snapshot and follow
        self._waiting: dict[int, tuple[set[int], asyncio.Future[Any], Any]] = {}
        # a follower's side
        self.applied = 0  # the number of the last op applied
        self.in_sync = mesh.index == WRITER
        self._early: list[tuple[int, bytes]] = []  # ops that came before the snapshot
        self._sync_task: asyncio.Task[None] | None = None
        self._synced_event = asyncio.Event()  # a follower is in sync
        #: how long a change waits for worker 0 when it is not linked (as this worker
        #: starts, or while worker 0 restarts) before it fails with `writer_down`
        self.writer_wait = WRITER_WAIT
        self._ready = asyncio.Event()  # started: the broker's definitions are back
        #: told () when this follower is in sync with worker 0, or on worker 0 when a
        #: worker synced with it (a starting worker waits for it: leveret.worker)
        self.sync_watchers: list[Callable[[], None]] = []
        #: told (reason, permanent) when this follower gives up syncing with worker 0:
        #: `permanent`, worker 0 refused it (SyncRefused); otherwise SYNC_TRIES tries in
        #: a row failed (leveret.worker exits, and its supervisor acts on it)
        self.sync_failures: list[Callable[[str, bool], None]] = []
        self.sync_retry_first = SYNC_RETRY_FIRST
        self.sync_retry_cap = SYNC_RETRY_CAP
        self.sync_tries = SYNC_TRIES
        self._sync_faults = os.environ.get(SYNC_FAULTS_ENV) or None
        # the connections of this worker, by number, and the stand-ins of other
        # workers' connections that own exclusive queues (with how many they own)
        # (from the clock: a restarted worker's connections get new numbers, not those
        # of its connections before, which other workers may still name)
        self._next_conn = time.time_ns()
        self._conns: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._refs: weakref.WeakKeyDictionary[Any, ConnRef] = weakref.WeakKeyDictionary()
        self._owners: dict[tuple[int, int], list[Any]] = {}
        self._owner_keys: dict[RemoteOwner, tuple[int, int]] = {}
        self.applying = False  # True while an op is applied (its deletions are not news)
        # True while this worker's MQTT sessions change its model themselves (their
        # queues and subscription bindings live on the worker that serves the client):
        # such changes go to worker 0 as made, as worker 0's own do.
        self.making = False
        self._made: set[asyncio.Future[Any]] = set()  # made changes not yet everywhere
        self._originals: dict[tuple[str, str], Callable[..., Any]] = {}
        # Worker 0: the workers whose first sync with this process is still to come
        # (their transient exchanges and bindings are taken then), and what was deleted
        # meanwhile (exchanges and queues by name, bindings by key), so that a late
        # sync does not bring back something deleted since this worker 0 started.
        self._first_sync: set[int] = set(range(1, mesh.count)) if mesh.index == WRITER else set()
        self._gone: set[tuple[Any, ...]] = set()
        # auto-delete exchanges taken from a first sync that had bindings as sources:
        # one left with none once every worker synced (its bindings went with queues
        # lost in worker 0's restart) is deleted then, as RabbitMQ deletes one whose
        # last binding went with a crashed node's queues
        self._taken_auto: set[tuple[str, str]] = set()
        mesh.on(META, self._on_meta)
        mesh.on(META_APPLIED, self._on_applied)
        mesh.serve("meta", self._serve_meta)
        mesh.serve("sync", self._serve_sync)
        mesh.serve("counts", self._serve_counts)
        mesh.peer_lost.append(self._peer_lost)
        mesh.peer_joined.append(self._peer_joined)

    @property
    def broker(self) -> Broker:
        return self._broker()

    # --- life ---------------------------------------------------------------------

    async def start(self) -> None:
        """The broker is built (its store's definitions are back): follow its vhosts'
        changes, serve syncs (worker 0), or sync with worker 0 (the others)."""
        self.broker.vhost_watchers.append(self._watch)
        self._originals = {
            ("admin", name): self._wrap(self.broker.admin, "admin", name) for name in ADMIN_CHANGES
        }
        for name in GLOBAL_PARAMETER_CHANGES:
            self._originals["global", name] = self._wrap(
                self.broker.global_parameters, "global", name
            )
        self._ready.set()
        if self.index == WRITER:
            self._synced_event.set()
            return
        try:
            await self.sync()
        except PeerDown:
            # A worker's links come up just after it starts accepting: no link to
            # worker 0 at this point is the normal start, not a fault worth a warning.
            log.info("worker %d: no link to worker %d yet; syncing once it is up", self.index, 0)
        except Exception as exc:
            # Tried again with a backoff, as a sync started by a new link is.
            self._sync_task = asyncio.ensure_future(self._sync_retrying(exc))

    def stop(self) -> None:
        """The node stops: no sync runs on."""
        if self._sync_task is not None:
            self._sync_task.cancel()

    def _wrap(self, target: Any, where: str, name: str) -> Callable[..., Any]:
        """Route `target.name(...)` through the writer; returns the original."""
        original = getattr(target, name)

        def change(*args: Any, **kwargs: Any) -> Any:
            if self.applying:  # a part of a change being applied (admin calls admin)
                return original(*args, **kwargs)
            if self.index != WRITER:
                if where == "global":  # made here on demand (internal_cluster_id)
                    return original(*args, **kwargs)
                raise InvalidValue(
                    f"worker {self.index} cannot change metadata itself: worker {WRITER} "
                    "(the management API, leveret ctl of worker 0) makes such changes"
                )
            self.applying = True
            try:
                result = original(*args, **kwargs)
            finally:
                self.applying = False
            self._broadcast((where, None, name, args, kwargs), None)
            return result

        setattr(target, name, change)
        return original

    async def settled(self) -> None:
        """Return once every change sent so far is applied by every live worker."""
        waiting = [done for _peers, done, _result in self._waiting.values()]
        if waiting:
            await asyncio.gather(*waiting)

    # --- connections ----------------------------------------------------------------

    def ref(self, conn: Any) -> ConnRef:
        """How every worker names `conn`, a client connection of this worker."""
        ref = self._refs.get(conn)
        if ref is None:
            self._next_conn += 1
            ref = self._refs[conn] = (self.index, self._next_conn, getattr(conn, "name", ""))
            self._conns[self._next_conn] = conn
        return ref

    def _conn_for(self, ref: ConnRef | None) -> Any:
        """The object that stands for connection `ref` here: the connection itself on
        its own worker (None once it is gone), its registered RemoteOwner elsewhere."""
        if ref is None:
            return None
        worker, number, name = ref
        if worker == self.index:
            conn = self._conns.get(number)
            return conn if conn is not None and getattr(conn, "state", None) != "closed" else None
        entry = self._owners.get((worker, number))
        return entry[0] if entry is not None else RemoteOwner(worker, name)

    def _owner_stand_in(self, ref: ConnRef) -> RemoteOwner:
        worker, number, name = ref
        entry = self._owners.get((worker, number))
        if entry is None:
            entry = self._owners[worker, number] = [RemoteOwner(worker, name), 0]
            self._owner_keys[entry[0]] = (worker, number)
        return entry[0]

    def _owner_ref(self, owner: Any) -> ConnRef | None:
        if owner is None:
            return None
        if type(owner) is RemoteOwner:
            key = self._owner_keys.get(owner)
            number = key[1] if key is not None else 0
            return (owner.worker, number, owner.connection)
        return self.ref(owner)

    # --- AMQP methods (installed on each channel of this worker) ------------------

    def channel_opened(self, ch: Any) -> None:
        """Route the channel's metadata methods through the writer."""
        handlers = ch._handlers
        handlers[EXCHANGE_DECLARE] = lambda m: self.exchange_declare(ch, m)
        handlers[EXCHANGE_DELETE] = lambda m: self.exchange_delete(ch, m)
        handlers[EXCHANGE_BIND] = lambda m: self.exchange_bind(ch, m)
        handlers[EXCHANGE_UNBIND] = lambda m: self.exchange_unbind(ch, m)
        handlers[QUEUE_DECLARE] = lambda m: self.queue_declare(ch, m)
        handlers[QUEUE_BIND] = lambda m: self.queue_bind(ch, m)
        handlers[QUEUE_UNBIND] = lambda m: self.queue_unbind(ch, m)
        handlers[QUEUE_DELETE] = lambda m: self.queue_delete(ch, m)

    def _run(self, ch: Any, index: int, result: Any, answer: Callable[[Any], None] | None) -> None:
        """Answer the client now, or once `result` (an awaitable) is done; the
        connection holds its later events meanwhile."""
        if isinstance(result, Awaitable):
            ch.conn.hold_for(asyncio.ensure_future(result), ch, index, answer or _nothing)
        elif answer is not None:
            answer(result)

    def exchange_declare(self, ch: Any, m: cmd.Exchange.Declare) -> None:
        if m.passive:
            ch.on_exchange_declare(m)  # a read: this worker's model has it
            return
        arguments = _args(m.arguments)
        ch.vhost.check_alternate_type(m.exchange, m.exchange_type, arguments)
        op = (
            "exchange.declare",
            ch.vhost.name,
            m.exchange,
            m.exchange_type,
            m.durable,
            m.auto_delete,
            m.internal,
            arguments,
            ch.conn.user or "",
        )
        answer = None if m.nowait else lambda _: ch.send_method(cmd.Exchange.DeclareOk())
        self._run(ch, EXCHANGE_DECLARE, self.submit(op), answer)

    def exchange_delete(self, ch: Any, m: cmd.Exchange.Delete) -> None:
        op = ("exchange.delete", ch.vhost.name, m.exchange, m.if_unused)
        answer = None if m.nowait else lambda _: ch.send_method(cmd.Exchange.DeleteOk())
        self._run(ch, EXCHANGE_DELETE, self.submit(op), answer)

    def exchange_bind(self, ch: Any, m: cmd.Exchange.Bind) -> None:
        self._exchange_binding(ch, m, "bind", EXCHANGE_BIND, cmd.Exchange.BindOk)

    def exchange_unbind(self, ch: Any, m: cmd.Exchange.Unbind) -> None:
        self._exchange_binding(ch, m, "unbind", EXCHANGE_UNBIND, cmd.Exchange.UnbindOk)

    def _exchange_binding(self, ch: Any, m: Any, kind: str, method: Any, ok: type) -> None:
        """exchange.bind and exchange.unbind: one change each, answered with `ok`."""
        op = (
            kind,
            ch.vhost.name,
            m.source,
            m.destination,
            False,
            m.routing_key,
            _args(m.arguments),
            None,
        )
        answer = None if m.nowait else lambda _: ch.send_method(ok())
        self._run(ch, method, self.submit(op), answer)

    def queue_declare(self, ch: Any, m: cmd.Queue.Declare) -> None:
        vhost = ch.vhost
        if m.passive:
            queue = vhost.queues.get(m.queue) if m.queue != PSEUDO_QUEUE else None
            if type(queue) is not RemoteQueue:
                ch.on_queue_declare(m)  # a read of this worker's own queue (or a 404)
                return
            vhost.get_queue(m.queue, ch.conn)  # exclusivity: 405 as the owner says
            self._run(ch, QUEUE_DECLARE, self._declared(None, vhost, m.queue), _declare_ok(ch, m))
            return
        name, server_named = m.queue, False
        if not name:
            name, server_named = ch.generated_queue_name or vhost.new_queue_name(), True
            ch.generated_queue_name = None
        placed = (
            self.index if (m.exclusive or server_named) else self.mesh.owner_of(vhost.name, name)
        )
        op = (
            "queue.declare",
            vhost.name,
            name,
            m.durable,
            m.exclusive,
            m.auto_delete,
            _args(m.arguments),
            self.ref(ch.conn),
            server_named,
            placed,
        )
        result = self.submit(op)
        queue = vhost.queues.get(name)
        if (
            not isinstance(result, Awaitable)
            and queue is not None
            and type(queue) is not RemoteQueue
        ):
            _declare_ok(ch, m)((name, queue.message_count, queue.consumer_count))
            return
        self._run(ch, QUEUE_DECLARE, self._declared(result, vhost, name), _declare_ok(ch, m))

    def queue_declare_op(
        self,
        vhost: str,
        name: str,
        durable: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> Op:
        """A declaration by no connection (the management API): placed by its name."""
        owner = self.mesh.owner_of(vhost, name)
        return (
            "queue.declare",
            vhost,
            name,
            durable,
            False,
            auto_delete,
            arguments,
            None,
            False,
            owner,
        )

    def import_item(
        self, vhost: VirtualHost, kind: str, item: dict[str, Any], user: str | None
    ) -> None:
        """An exchange, queue or binding of a definitions import (on worker 0), made
        as that change; the management API answers once every worker has it."""
        if self.index != WRITER and not self.applying:
            raise InvalidValue(
                f"worker {self.index} cannot change metadata itself: worker {WRITER} imports"
            )
        if not definitions_json.wanted(vhost, kind, item):
            return  # an object that exists, a binding with a missing end: as one process
        # JSON integers are longs, as one process imports them (definitions_json)
        arguments = definitions_json.json_arguments(item.get("arguments") or {})
        op: Op
        if kind == "exchanges":
            op = (
                "exchange.declare",
                vhost.name,
                item["name"],
                item["type"],
                bool(item.get("durable", True)),
                bool(item.get("auto_delete", False)),
                bool(item.get("internal", False)),
                arguments,
                user or INTERNAL_USER,
            )
        elif kind == "queues":
            if item.get("type") and "x-queue-type" not in arguments:
                arguments = {**arguments, "x-queue-type": item["type"]}
            name = item["name"]
            op = (
                *self.queue_declare_op(
                    vhost.name,
                    name,
                    bool(item.get("durable", True)),
                    bool(item.get("auto_delete", False)),
                    arguments,
                ),
                False,  # as stored: no default queue type
            )
        else:
            op = (
                "bind",
                vhost.name,
                item["source"],
                item["destination"],
                item["destination_type"] == "queue",
                item.get("routing_key", ""),
                arguments,
                None,
            )
        self.submit(op)

    async def _declared(self, change: Any, vhost: VirtualHost, name: str) -> tuple[str, int, int]:
        """A declaration done (`change`, when one was made): the queue's counts, from
        its owner when that is another worker."""
        if isinstance(change, Awaitable):
            await change
        queue = vhost.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost.name}'")
        counts = await self.counts(queue)
        return name, counts[0], counts[1]

    async def counts(self, queue: Any) -> tuple[int, int]:
        """(messages, consumers) of a queue, asked of its owner if another worker."""
        if type(queue) is not RemoteQueue:
            return queue.message_count, queue.consumer_count
        try:
            return await self.mesh.call(queue.worker, "counts", queue.vhost.name, queue.name)
        except PeerDown:
            raise absent(queue.vhost.name, queue.name, queue.worker, queue.durable) from None

    def queue_bind(self, ch: Any, m: cmd.Queue.Bind) -> None:
        queue = ch.queue_by_name(m.queue)  # 404 / 405 here, as on one process
        op = (
            "bind",
            ch.vhost.name,
            m.exchange,
            queue.name,
            True,
            m.routing_key,
            _args(m.arguments),
            self.ref(ch.conn),
        )
        answer = None if m.nowait else lambda _: ch.send_method(cmd.Queue.BindOk())
        self._run(ch, QUEUE_BIND, self.submit(op), answer)

    def queue_unbind(self, ch: Any, m: cmd.Queue.Unbind) -> None:
        name = m.queue or ch.last_queue_name
        if not name:
            raise ChannelError(404, "no previously declared queue")
        op = (
            "unbind",
            ch.vhost.name,
            m.exchange,
            name,
            True,
            m.routing_key,
            _args(m.arguments),
            self.ref(ch.conn),
        )
        self._run(ch, QUEUE_UNBIND, self.submit(op), lambda _: ch.send_method(cmd.Queue.UnbindOk()))

    def queue_delete(self, ch: Any, m: cmd.Queue.Delete) -> None:
        name = m.queue or ch.last_queue_name or ""
        if name not in ch.vhost.queues:
            # Deleting a missing queue succeeds, as in RabbitMQ 3.x.
            if not m.nowait:
                ch.send_method(cmd.Queue.DeleteOk(0))
            return
        queue = ch.queue_by_name(name)  # 405 for another connection's exclusive queue
        self._run(ch, QUEUE_DELETE, self._delete(ch, queue, m), None)

    async def _delete(self, ch: Any, queue: Any, m: cmd.Queue.Delete) -> None:
        messages, consumers = await self.counts(queue)
        if m.if_unused and consumers:
            raise PreconditionFailed(f"{queue.describe()} in use")
        if m.if_empty and messages:
            raise PreconditionFailed(f"{queue.describe()} not empty")
        ref = self.ref(ch.conn)
        # The worker of the client sends delete-ok as it applies the change, before
        # the basic.cancel of the queue's consumers (py-amqp wants that order).
        answer = None if m.nowait else (ch.number, messages)
        held: asyncio.Future[None] | None = None
        if replica.TAP is not None:
            # A leading cluster node: delete-ok (written as the change is applied on
            # this worker, before the cancels of the queue's consumers) and all output
            # after it leave once the followers hold every worker's deletion, as a
            # declare-ok does, so a queue deleted just before a failover stays deleted.
            held = asyncio.get_running_loop().create_future()
            ch.conn.hold_output_until(held)
        try:
            done = self.submit(("queue.delete", queue.vhost.name, queue.name, ref, answer))
            if isinstance(done, Awaitable):
                await done
        finally:
            if held is not None:
                held.set_result(None)

    # --- the writer -----------------------------------------------------------------

    def submit(self, op: Op) -> Any:
        """Make a change: its result, or an awaitable of it once every worker has it.
        On worker 0 a refused change raises here; elsewhere its awaitable does."""
        if self.index == WRITER:
            return self._write(op)
        return self._submit_remote(op)

    async def _submit_remote(self, op: Op) -> Any:
        for attempt in (1, 2):
            if not self.in_sync:
                await self._until_synced()
            try:
                return await self.mesh.call(WRITER, "meta", op)
            except PeerDown:
                # Worker 0 went down with the change in flight: once it is back (its
                # supervisor restarts it), the change is made again (declarations,
                # bindings and deletions come to the same when made twice).
                if attempt == 2:
                    raise writer_down() from None
        raise writer_down()

    async def _until_synced(self) -> None:
        """Wait for a sync with worker 0: the first one as this worker starts, or the
        next one while worker 0 restarts; `writer_wait` seconds at most."""
        try:
            await asyncio.wait_for(self._synced_event.wait(), self.writer_wait)
        except TimeoutError:
            raise writer_down() from None

    def _write(self, op: Op) -> Any:
        """Worker 0: check `op` against the model (placement), apply it, send it on."""
        self._check_placement(op)
        self.applying = True
        try:
            result = self._apply(op)
        finally:
            self.applying = False
        return _replicated(self._broadcast(op, result))

    def _broadcast(self, op: Op, result: Any) -> Any:
        self.seq += 1
        seq = self.seq
        live = set(self.mesh.peers)
        peers = {p for p in self.synced if p in live}
        if not peers:
            return result
        body = pickle.dumps(op, protocol=pickle.HIGHEST_PROTOCOL)
        for peer in peers:
            self.mesh.send(peer, Meta(seq, body))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = (peers, done, result)
        return done

    def _check_placement(self, op: Op) -> None:
        """A queue whose owner is down answers as RabbitMQ's does when its node is."""
        if op[0] != "queue.declare":
            return
        vhost = self.broker.vhosts.get(op[1])
        if vhost is None:
            return
        name, durable, worker = op[2], op[3], op[9]
        existing = vhost.queues.get(name)
        if existing is not None:
            if type(existing) is not RemoteQueue:
                return
            worker, durable = existing.worker, existing.durable
        # (a worker that is linked but not yet in sync is still starting: not there)
        if worker != self.index and (worker not in self.mesh.peers or worker not in self.synced):
            raise absent(vhost.name, name, worker, durable)

    def _serve_meta(self, peer: int, op: Op, made: bool = False) -> Any:
        if made:  # the model made it on `peer`, where it is applied already
            self.applying = True
            try:
                self._apply(op)
            except Exception:
                log.exception("applying %r made by worker %d", op[:3], peer)
            finally:
                self.applying = False
            return _replicated(self._broadcast(op, None))
        return self._write(op)

    def _on_applied(self, peer: int, record: MetaApplied) -> None:
        for seq in sorted(self._waiting):
            if seq > record.seq:
                break
            peers, done, result = self._waiting[seq]
            peers.discard(peer)
            if not peers:
                del self._waiting[seq]
                if not done.done():
                    done.set_result(result)

    def _peer_lost(self, peer: int) -> None:
        if self.index == WRITER:
            self.synced.discard(peer)
            for seq in sorted(self._waiting):
                peers, done, result = self._waiting[seq]
                peers.discard(peer)
                if not peers:
                    del self._waiting[seq]
                    if not done.done():
                        done.set_result(result)
        elif peer == WRITER:
            self.in_sync = False
            self._early.clear()
            self._synced_event.clear()

    def _peer_joined(self, peer: int) -> None:
        if peer == WRITER and self.index != WRITER and self._ready.is_set():
            self._start_sync()

    def _start_sync(self) -> None:
        """Sync with worker 0 in the background, unless a sync runs (or waits to be
        tried again) already: that one takes the newest link and the latest ops."""
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.ensure_future(self._sync_retrying())

    async def _sync_retrying(self, failed: BaseException | None = None) -> None:
        """Sync until it succeeds, the link to worker 0 is lost (its next link starts
        a sync), worker 0 refuses (permanent), or `sync_tries` tries in a row failed.

        A failure other than a lost link is logged once per distinct error, with what
        happens next; the same error again is not logged again. `failed`: the first
        try's error, when the caller made that try."""
        delay = self.sync_retry_first
        seen: set[str] = set()
        tries = 0
        while True:
            if failed is None:
                try:
                    await self.sync()
                except PeerDown:
                    return
                except Exception as exc:  # noqa: BLE001 - logged and tried again
                    failed = exc
                else:
                    if tries:
                        log.warning(
                            "worker %d synced with worker %d after %d failed tries",
                            self.index,
                            WRITER,
                            tries,
                        )
                    return
            if isinstance(failed, SyncRefused):
                self._give_up(f"worker {WRITER} refused its sync: {failed}", True)
                return
            tries += 1
            text = f"{type(failed).__name__}: {failed}"
            failed = None
            if tries >= self.sync_tries:
                self._give_up(f"{tries} tries in a row failed, the last with {text}", False)
                return
            if text not in seen:
                seen.add(text)
                log.error(
                    "worker %d could not sync with worker %d (try %d): %s; trying again "
                    "with a backoff of %g s doubling up to %g s, %d tries at most "
                    "(the same error is not logged again)",
                    self.index,
                    WRITER,
                    tries,
                    text,
                    delay,
                    self.sync_retry_cap,
                    self.sync_tries,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.sync_retry_cap)

    def _give_up(self, reason: str, permanent: bool) -> None:
        log.error(
            "worker %d cannot sync with worker %d: %s; %s",
            self.index,
            WRITER,
            reason,
            "trying again cannot mend it"
            if permanent
            else "giving up (a restart of this worker syncs afresh)",
        )
        for tell in list(self.sync_failures):
            tell(reason, permanent)

    # --- changes the model makes by itself ----------------------------------------

    def _watch(self, vhost: VirtualHost, event: str, subject: Any) -> None:
        if self._first_sync:
            self._note_gone(vhost, event, subject)
        if event != "queue-deleted":
            if not self.applying and self._ready.is_set():
                if self.index == WRITER or self.making:
                    self._made_here(vhost, event, subject)
            return
        owner = subject.exclusive_owner
        if type(owner) is RemoteOwner:
            self._release_owner(owner)
        if self.applying:
            return
        # Not an op being applied: the model deleted the queue here (auto-delete,
        # exclusive owner gone, x-expires, an API call). Every worker must follow.
        self.model_change(("queue.deleted", vhost.name, subject.name))

    def made_settled(self) -> asyncio.Future[Any]:
        """A future done once every change made here so far (MQTT's) is applied by
        every live worker (or could not be: its failure was logged)."""
        return asyncio.gather(*self._made, return_exceptions=True)

    def _track(self, change: Any) -> None:
        if isinstance(change, asyncio.Future) and not change.done():
            self._made.add(change)
            change.add_done_callback(self._made.discard)

    def _made_here(self, vhost: VirtualHost, event: str, subject: Any) -> None:
        """This worker's model changed other than by an op: an MQTT session (served on
        the worker its client reached) declared or bound something. Send it on as made:
        from worker 0 to the others, from another worker through worker 0."""
        op: Op
        if event == "queue":
            if type(subject) is RemoteQueue:
                return
            ref = self._owner_ref(subject.exclusive_owner)
            op = (
                "queue.declare",
                vhost.name,
                subject.name,
                subject.durable,
                ref is not None,
                subject.auto_delete,
                subject.arguments,
                ref,
                subject.name.startswith("amq.gen-"),
                self.index,
                False,
            )
        elif event == "exchange":
            op = (
                "exchange.declare",
                vhost.name,
                subject.name,
                subject.type_name,
                subject.durable,
                subject.auto_delete,
                subject.internal,
                subject.arguments,
                getattr(subject, "declared_by", INTERNAL_USER),
            )
        elif event == "exchange-deleted":
            op = ("exchange.delete", vhost.name, subject.name, False)
        elif event in ("bind", "unbind"):
            dest = subject.destination
            to_queue = type(dest) is not Exchange
            op = (
                event,
                vhost.name,
                subject.source.name,
                dest.name,
                to_queue,
                subject.routing_key,
                subject.arguments,
                MADE,
            )
        else:
            return  # policies: sent as the admin change that set them
        self.model_change(op)

    def _release_owner(self, owner: RemoteOwner) -> None:
        key = self._owner_keys.get(owner)
        entry = self._owners.get(key) if key is not None else None
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._owners[key]
                del self._owner_keys[owner]

    def model_change(self, op: Op) -> None:
        """A change already applied here: have every other worker apply it too."""
        if self.index == WRITER:
            self._track(self._broadcast(op, None))
            return
        if not self.in_sync:
            return  # the next sync tells worker 0
        try:
            call = self.mesh.call(WRITER, "meta", op, True)
        except PeerDown:
            return
        call.add_done_callback(_log_failure)
        self._track(call)

    # --- followers ----------------------------------------------------------------

    def _on_meta(self, peer: int, record: Meta) -> None:
        if peer != WRITER:
            log.error("worker %d sent a metadata change; only worker %d may", peer, WRITER)
            return
        if not self.in_sync:
            self._early.append((record.seq, record.change))
            return
        self._apply_numbered(record.seq, record.change)

    def _apply_numbered(self, seq: int, body: bytes) -> None:
        if seq <= self.applied:
            pass  # already in the snapshot
        elif seq != self.applied + 1:
            log.error(
                "worker %d missed metadata changes %d..%d: syncing",
                self.index,
                self.applied + 1,
                seq - 1,
            )
            self.in_sync = False  # what comes until the snapshot waits for it
            self._start_sync()
            return
        else:
            op = pickle.loads(body)
            self.applying = True
            failed = False
            try:
                self._apply(op)
            except Exception:
                # Worker 0 applied it: this worker's model differs from worker 0's.
                log.exception(
                    "worker %d could not apply metadata change %d %r; syncing",
                    self.index,
                    seq,
                    op[:3],
                )
                failed = True
            finally:
                self.applying = False
            self.applied = seq
            if failed:
                self._start_sync()
        self._send_applied(seq)

    def _send_applied(self, seq: int) -> None:
        """Tell worker 0 that this worker applied every change up to `seq`. A worker of
        a leading cluster node says so only once the node's followers hold what that
        wrote to its definitions (cluster/workertap.py), so that the answer to the
        change's client (declare-ok, HTTP 201) survives a failover; in change order,
        as the tap releases its waiters in the order of their positions."""

        def send() -> None:
            try:
                self.mesh.send(WRITER, MetaApplied(seq))
            except PeerDown:
                pass

        tap = replica.TAP
        if tap is None:
            send()
        else:
            tap.when_safe(tap.sql_position, send)  # type: ignore[attr-defined]
            tap.check()  # type: ignore[attr-defined]

    # --- applying ops (every worker, the same code) --------------------------------

    def _apply(self, op: Op) -> Any:
        kind, vhost_name = op[0], op[1]
        if kind in ("admin", "global"):
            _kind, _vhost, name, args, kwargs = op
            self._originals[kind, name](*args, **kwargs)
            return None
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            raise NotFound(f"no vhost '{vhost_name}'")
        if kind == "exchange.declare":
            name, type_name, durable, auto_delete, internal, arguments, user = op[2:]
            vhost.declare_exchange(
                name, type_name, False, durable, auto_delete, internal, arguments, user
            )
            return None
        if kind == "exchange.delete":
            vhost.delete_exchange(op[2], op[3])
            return None
        if kind == "bind":
            source, dest, to_queue, routing_key, arguments, ref = op[2:]
            if not to_queue:
                destination = vhost.get_exchange(dest)
            elif ref == MADE:  # made by worker 0's own model: no one to check
                destination = vhost.get_queue(dest, _owner_of(vhost, dest))
            else:
                destination = vhost.get_queue(dest, self._conn_for(ref))
            vhost.bind(vhost.get_exchange(source), destination, routing_key, arguments)
            return None
        if kind == "unbind":
            source, dest, to_queue, routing_key, arguments, ref = op[2:]
            conn = _owner_of(vhost, dest) if ref == MADE else self._conn_for(ref)
            vhost.unbind(source, dest, to_queue, routing_key, arguments, conn)
            return None
        if kind == "queue.declare":
            return self._queue_declare(vhost, *op[2:])
        if kind == "queue.delete":
            return self._queue_delete(vhost, *op[2:])
        if kind == "queue.deleted":
            queue = vhost.queues.get(op[2])
            if queue is not None:
                vhost.delete_queue(queue)
            return None
        raise ValueError(f"unknown metadata change {kind!r}")

    def _queue_declare(
        self,
        vhost: VirtualHost,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        ref: ConnRef,
        server_named: bool,
        placed: int,
        default_type: bool = True,
    ) -> str:
        existing = vhost.queues.get(name)
        mine = placed == self.index
        churn = list(vhost.churn)
        conn = self._conn_for(ref)
        if exclusive and existing is None and not mine:
            conn = self._owner_stand_in(ref)
        queue = vhost.declare_queue(
            name,
            False,
            durable,
            exclusive,
            auto_delete,
            arguments,
            conn,
            server_named,
            default_type=default_type,
            worker=None if mine else placed,
        )
        if type(queue) is RemoteQueue:
            vhost.churn[:] = churn  # declared and created: counted by the owner
        if existing is None and exclusive:
            if type(conn) is RemoteOwner:
                self._owners[(ref[0], ref[1])][1] += 1
            elif conn is not None:
                conn.exclusive_queues.add(queue)
            else:  # its connection closed before the declaration reached its worker
                asyncio.get_running_loop().call_soon(self._drop_orphan, vhost, queue)
        return name

    def _drop_orphan(self, vhost: VirtualHost, queue: Any) -> None:
        if not queue.deleted:
            vhost.delete_queue(queue)

    def _queue_delete(
        self,
        vhost: VirtualHost,
        name: str,
        ref: ConnRef,
        answer: tuple[int, int] | None,
    ) -> None:
        if answer is not None and ref[0] == self.index:  # the client's worker answers
            conn = self._conn_for(ref)
            ch = conn.channels.get(answer[0]) if conn is not None else None
            if ch is not None and not ch.closing:
                ch.send_method(cmd.Queue.DeleteOk(answer[1]))
        queue = vhost.queues.get(name)
        if queue is None:
            return
        owner = queue.exclusive_owner
        vhost.delete_queue(queue)
        held = getattr(owner, "exclusive_queues", None)  # an AMQP connection's
        if held is not None:
            held.discard(queue)

    # --- sync ---------------------------------------------------------------------

    async def sync(self) -> None:
        """A follower (re)joins worker 0: tell it the queues only this worker knows,
        take its snapshot, and follow from its op number on."""
        self.in_sync = False
        self._early = []
        self._synced_event.clear()
        if self._sync_faults is not None:
            _injected_sync_fault(self._sync_faults)
        snapshot = await self.mesh.call(
            WRITER, "sync", self._claims(), self.mesh.count, self._transient()
        )
        lost = self.reconcile(snapshot)
        self.applied = snapshot["seq"]
        self.in_sync = True
        self._send_applied(self.applied)  # what worker 0 sent before the snapshot is in it
        early, self._early = self._early, []
        for seq, body in sorted(early):
            if self.in_sync:
                self._apply_numbered(seq, body)
        self._synced_event.set()
        for vhost_name, name in lost:  # ours, but gone with our restart
            self.model_change(("queue.deleted", vhost_name, name))
        log.info("worker %d in sync with worker %d at change %d", self.index, WRITER, self.applied)
        for tell in list(self.sync_watchers):
            tell()

    def _claims(self) -> list[tuple[Any, ...]]:
        """This worker's queues that only its memory holds (transient or exclusive),
        with their bindings: a restarted worker 0 knows only what it stored."""
        claims = []
        for vhost in self.broker.vhosts.values():
            for queue in vhost.queues.values():
                if type(queue) is RemoteQueue or queue.stores_messages:
                    continue
                bindings = [
                    (b.source.name, b.routing_key, b.arguments)
                    for b in queue.bindings
                    if b.source.name
                ]
                claims.append(
                    (
                        vhost.name,
                        queue.name,
                        queue.durable,
                        queue.exclusive_owner is not None,
                        queue.auto_delete,
                        queue.arguments,
                        self._owner_ref(queue.exclusive_owner) or (self.index, 0, ""),
                        queue.name.startswith("amq.gen-"),
                        bindings,
                    )
                )
        return claims

    def _transient(self) -> dict[str, Any]:
        """The transient exchanges this worker holds, and the bindings that are not
        stored (one end transient or exclusive), by vhost: a restarted worker 0 stored
        none of them, and takes them from the first sync of each worker."""
        vhosts: dict[str, Any] = {}
        for vhost in self.broker.vhosts.values():
            exchanges = [
                (
                    ex.name,
                    ex.type_name,
                    ex.auto_delete,
                    ex.internal,
                    ex.arguments,
                    getattr(ex, "declared_by", ""),
                )
                for ex in vhost.exchanges.values()
                if ex.name and not ex.durable
            ]
            bindings = [
                (key, b.arguments)
                for key, b in _bindings(vhost).items()
                if not vhost._binding_is_durable(b)
            ]
            if exchanges or bindings:
                vhosts[vhost.name] = {"exchanges": exchanges, "bindings": bindings}
        return vhosts

    def _take_exchanges(self, peer: int, transient: dict[str, Any]) -> None:
        """Worker 0: declare the transient exchanges of a worker's first sync that it
        lacks and did not delete since it started, each as an op sent on."""
        for vhost_name, held in transient.items():
            vhost = self.broker.vhosts.get(vhost_name)
            if vhost is None:
                continue
            for name, type_name, auto_delete, internal, arguments, user in held["exchanges"]:
                if name in vhost.exchanges or (vhost_name, "exchange", name) in self._gone:
                    continue
                op = (
                    "exchange.declare",
                    vhost_name,
                    name,
                    type_name,
                    False,
                    auto_delete,
                    internal,
                    arguments,
                    user,
                )
                try:
                    self._write(op)
                except Exception:
                    log.exception("worker %d's exchange '%s' could not be taken", peer, name)
                    continue
                if auto_delete and any(b[0][0] == name for b in held["bindings"]):
                    self._taken_auto.add((vhost_name, name))

    def _take_bindings(self, peer: int, transient: dict[str, Any]) -> None:
        """Worker 0: make the unstored bindings of a worker's first sync that it lacks,
        whose ends it has, and which it (or either end) did not delete since it started."""
        for vhost_name, held in transient.items():
            vhost = self.broker.vhosts.get(vhost_name)
            if vhost is None:
                continue
            have = _bindings(vhost)
            claimed = _claimed_exchanges(transient, vhost_name)
            for key, arguments in held["bindings"]:
                source, dest, to_queue, routing_key, _akey = key
                if key in have or not self._may_bind(vhost, key, claimed):
                    continue
                op = ("bind", vhost_name, source, dest, to_queue, routing_key, arguments, MADE)
                try:
                    self._write(op)
                except Exception:
                    log.exception("worker %d's binding %r could not be taken", peer, key)

    def _may_bind(
        self,
        vhost: VirtualHost,
        key: tuple[str, str, bool, str, str],
        claimed: dict[str, tuple[Any, ...]],
    ) -> bool:
        """Worker 0: whether a binding a sync brings (by its key) may be made: both
        ends here, neither (nor the binding) deleted since this worker 0 started, and a
        transient exchange at either end the one the sync holds (a client of worker 0
        may have made another of its name meanwhile)."""
        source, dest, to_queue, _routing_key, _akey = key
        gone = self._gone
        return (
            _same_exchange(vhost, source, claimed)
            and (dest in vhost.queues if to_queue else _same_exchange(vhost, dest, claimed))
            and (vhost.name, "binding", key) not in gone
            and (vhost.name, "exchange", source) not in gone
            and (vhost.name, "queue" if to_queue else "exchange", dest) not in gone
        )

    def _drop_unbound_auto_delete(self) -> None:
        """Worker 0, once every worker synced: delete each auto-delete exchange taken
        from a sync with bindings that is left with none."""
        taken, self._taken_auto = self._taken_auto, set()
        for vhost_name, name in sorted(taken):
            vhost = self.broker.vhosts.get(vhost_name)
            ex = vhost.exchanges.get(name) if vhost is not None else None
            if ex is None or ex.durable or not ex.auto_delete or ex.bindings:
                continue
            try:
                self._write(("exchange.delete", vhost_name, name, False))
            except Exception:
                log.exception("auto-delete exchange '%s' could not be deleted", name)

    def _note_gone(self, vhost: VirtualHost, event: str, subject: Any) -> None:
        """Worker 0, until every worker's first sync: remember a deletion."""
        if event == "exchange-deleted":
            self._gone.add((vhost.name, "exchange", subject.name))
        elif event == "queue-deleted":
            self._gone.add((vhost.name, "queue", subject.name))
        elif event == "unbind":
            self._gone.add((vhost.name, "binding", _binding_key(subject)))

    async def _serve_sync(
        self,
        peer: int,
        claims: list[tuple[Any, ...]],
        count: int | None = None,
        transient: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if count is not None and count != self.mesh.count:
            # Not one broker: its queues' placement (by the count) differs from ours.
            raise SyncRefused(
                f"worker {peer} runs as one of {count} workers, worker {WRITER} as one "
                f"of {self.mesh.count}"
            )
        await self._ready.wait()
        # Only a worker's first sync with this process brings its transient exchanges
        # and bindings (the others', held by a worker linked before, are worker 0's
        # already; a later sync is a worker that lost its link and may be behind).
        first = peer in self._first_sync and transient is not None
        if first:
            self._take_exchanges(peer, transient)
        for claim in claims:
            vhost_name, name, durable, exclusive, auto_delete, arguments, ref = claim[:7]
            server_named, bindings = claim[7], claim[8]
            vhost = self.broker.vhosts.get(vhost_name)
            if vhost is None or name in vhost.queues or (vhost_name, "queue", name) in self._gone:
                continue  # (deleted since this worker 0 started: the owner drops it)
            try:
                op = (
                    "queue.declare",
                    vhost_name,
                    name,
                    durable,
                    exclusive,
                    auto_delete,
                    arguments,
                    ref,
                    server_named,
                    peer,
                )
                self.applying = True
                try:
                    self._apply(op)
                finally:
                    self.applying = False
                self._broadcast(op, None)
                claimed = _claimed_exchanges(transient, vhost_name)
                for source, routing_key, args in bindings:
                    key = (source, name, True, routing_key, arguments_key(args))
                    if self._may_bind(vhost, key, claimed):
                        bind = ("bind", vhost_name, source, name, True, routing_key, args, ref)
                        self._write(bind)
            except Exception:
                log.exception("worker %d's queue '%s' could not be taken", peer, name)
        if first:
            self._take_bindings(peer, transient)
            self._first_sync.discard(peer)
            if not self._first_sync:
                self._gone.clear()  # every worker synced: no claim can bring them back
                self._drop_unbound_auto_delete()
        snapshot = self.snapshot()
        self.synced.add(peer)
        for tell in list(self.sync_watchers):
            tell()
        return snapshot

    def snapshot(self) -> dict[str, Any]:
        """The whole topology with each queue's owner, and the number of the last op."""
        vhosts: dict[str, Any] = {}
        for vhost in self.broker.vhosts.values():
            exchanges = [
                (
                    ex.name,
                    ex.type_name,
                    ex.durable,
                    ex.auto_delete,
                    ex.internal,
                    ex.arguments,
                    getattr(ex, "declared_by", ""),
                )
                for ex in vhost.exchanges.values()
                if ex.name
            ]
            queues = [
                (
                    q.name,
                    q.worker if type(q) is RemoteQueue else self.index,
                    q.durable,
                    q.auto_delete,
                    q.arguments,
                    self._owner_ref(q.exclusive_owner),
                )
                for q in vhost.queues.values()
            ]
            vhosts[vhost.name] = {
                "exchanges": exchanges,
                "queues": queues,
                "bindings": [(k, b.arguments) for k, b in _bindings(vhost).items()],
            }
        return {"seq": self.seq, "admin": self._admin_state(), "vhosts": vhosts}

    def _admin_state(self) -> dict[str, Any]:
        """Vhosts, users, permissions, limits, policies and global parameters, as a
        definitions export has them (runtime parameters, which start shovels and
        federation links, stay with worker 0)."""
        doc = definitions_json.export_definitions(self.broker)
        doc["parameters"] = [
            p for p in doc["parameters"] if p["component"] in ("vhost-limits", "operator_policy")
        ]
        for kind in ("queues", "exchanges", "bindings"):
            doc.pop(kind, None)
        return doc

    def _reconcile_admin(self, want: dict[str, Any]) -> None:
        """Make this worker's vhosts, users, permissions and policies worker 0's."""
        broker = self.broker
        admin = broker.admin
        original = self._originals
        vhosts = {v["name"] for v in want["vhosts"]}
        for name in [n for n in broker.vhosts if n not in vhosts]:
            original["admin", "delete_vhost"](name)
        users = {u["name"] for u in want["users"]}
        for name in [n for n in broker.access.users if n not in users]:
            original["admin", "delete_user"](name)
        permissions = {(p["user"], p["vhost"]) for p in want["permissions"]}
        for user, vhost in [k for k in broker.access.permissions if k not in permissions]:
            original["admin", "clear_permissions"](user, vhost)
        topics = {(t["user"], t["vhost"], t["exchange"]) for t in want["topic_permissions"]}
        for record in admin.list_topic_permissions():
            key = (record["user"], record["vhost"], record["exchange"])
            if key not in topics:
                original["admin", "clear_topic_permissions"](*key)
        policies = {(p["vhost"], p["name"]) for p in want["policies"]}
        operator = {
            (p["vhost"], p["name"])
            for p in want["parameters"]
            if p["component"] == "operator_policy"
        }
        limited = {p["vhost"] for p in want["parameters"] if p["component"] == "vhost-limits"}
        for vhost in list(broker.vhosts.values()):
            for name in [n for n in vhost.policies if (vhost.name, n) not in policies]:
                original["admin", "clear_policy"](vhost.name, name)
            for name in [n for n in vhost.operator_policies if (vhost.name, n) not in operator]:
                original["admin", "clear_operator_policy"](vhost.name, name)
            if vhost.limits and vhost.name not in limited:
                original["admin", "clear_vhost_limits"](vhost.name)
        definitions_json.import_definitions(broker, want)

    def reconcile(self, snapshot: dict[str, Any]) -> list[tuple[str, str]]:
        """Make this worker's topology the snapshot's, keeping the messages of the
        queues it owns; returns the queues the snapshot gives it that it lost."""
        lost: list[tuple[str, str]] = []
        self.applying = True
        try:
            if "admin" in snapshot:
                self._reconcile_admin(snapshot["admin"])
            for vhost_name, want in snapshot["vhosts"].items():
                vhost = self.broker.vhosts.get(vhost_name)
                if vhost is not None:
                    lost += self._reconcile_vhost(vhost, want)
        finally:
            self.applying = False
        return lost

    def _reconcile_vhost(self, vhost: VirtualHost, want: dict[str, Any]) -> list[tuple[str, str]]:
        lost: list[tuple[str, str]] = []
        queues = {q[0]: q for q in want["queues"]}
        for name, queue in list(vhost.queues.items()):
            q = queues.get(name)
            if q is None or not self._same_queue(queue, q):
                self._attempt(vhost.delete_queue, queue)
        exchanges = {e[0]: e for e in want["exchanges"]}
        for name, ex in list(vhost.exchanges.items()):
            e = exchanges.get(name)
            if not name:
                continue
            if (
                e is None
                or (ex.type_name, ex.durable, ex.auto_delete, ex.internal, ex.arguments) != e[1:6]
            ):
                self._attempt(vhost._remove_exchange, ex)
        for name, type_name, durable, auto_delete, internal, arguments, user in exchanges.values():
            if name not in vhost.exchanges:
                self._attempt(
                    vhost.declare_exchange,
                    name,
                    type_name,
                    False,
                    durable,
                    auto_delete,
                    internal,
                    arguments,
                    user or "",
                )
        for q in queues.values():
            if q[0] not in vhost.queues:
                self._attempt(self._reconcile_queue, vhost, q, lost)
        have = _bindings(vhost)
        wanted = dict(want["bindings"])
        for key in set(have) - set(wanted):
            self._attempt(vhost._drop_binding, have[key], False)
        for key in set(wanted) - set(have):
            source_name, dest_name, to_queue, routing_key, _akey = key
            source = vhost.exchanges.get(source_name)
            dest = vhost.queues.get(dest_name) if to_queue else vhost.exchanges.get(dest_name)
            if source is not None and dest is not None:
                self._attempt(vhost.bind, source, dest, routing_key, wanted[key])
        return lost

    def _reconcile_queue(
        self, vhost: VirtualHost, q: tuple[Any, ...], lost: list[tuple[str, str]]
    ) -> None:
        """A queue of the snapshot that this worker lacks."""
        name, worker, durable, auto_delete, arguments, ref = q
        server_named = name.startswith("amq.")  # (names the broker made: amq.gen-*)
        if worker == self.index and (ref is not None or not durable):
            lost.append((vhost.name, name))  # gone with this worker's restart
            return
        if worker == self.index:  # durable, but not in this worker's store: empty
            vhost.declare_queue(
                name, False, durable, False, auto_delete, arguments, server_named=server_named
            )
            return
        owner = self._owner_stand_in(ref) if ref is not None else None
        vhost.declare_queue(
            name,
            False,
            durable,
            owner is not None,
            auto_delete,
            arguments,
            owner,
            server_named,
            worker=worker,
        )
        if owner is not None:
            self._owners[(ref[0], ref[1])][1] += 1

    def _attempt(self, change: Callable[..., Any], *args: Any) -> None:
        """One step of a reconciliation; one that fails is logged, and the rest goes on."""
        try:
            change(*args)
        except Exception:
            log.exception(
                "worker %d could not take %s%r from worker %d",
                self.index,
                getattr(change, "__name__", change),
                args[:2],
                WRITER,
            )

    def _same_queue(self, queue: Any, q: tuple[Any, ...]) -> bool:
        name, worker, durable, auto_delete, arguments, ref = q
        remote = type(queue) is RemoteQueue
        if remote != (worker != self.index):
            return False
        if remote and queue.worker != worker:
            return False
        return (queue.durable, queue.auto_delete, queue.arguments) == (
            durable,
            auto_delete,
            arguments,
        )

    # --- served to other workers ----------------------------------------------------

    def _serve_counts(self, peer: int, vhost_name: str, name: str) -> tuple[int, int]:
        vhost = self.broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if queue is None or type(queue) is RemoteQueue:
            raise NotFound(f"no queue '{name}' in vhost '{vhost_name}'")
        return queue.message_count, queue.consumer_count


def _owner_of(vhost: VirtualHost, name: str) -> Any:
    """Whoever may use queue `name` (its exclusive owner, or None)."""
    queue = vhost.queues.get(name)
    return queue.exclusive_owner if queue is not None else None


def _claimed_exchanges(transient: dict[str, Any] | None, vhost: str) -> dict[str, tuple[Any, ...]]:
    """The transient exchanges a sync holds in `vhost`, by name: (type, durable,
    auto-delete, internal, arguments), as `_same_exchange` compares them."""
    held = (transient or {}).get(vhost)
    if not held:
        return {}
    return {e[0]: (e[1], False, *e[2:5]) for e in held["exchanges"]}


def _same_exchange(vhost: VirtualHost, name: str, claimed: dict[str, tuple[Any, ...]]) -> bool:
    """Whether worker 0's exchange `name` is the one a sync's claim holds: the same
    transient exchange when the claim lists it; any exchange of the name otherwise."""
    ex = vhost.exchanges.get(name)
    if ex is None:
        return False
    want = claimed.get(name)
    return (
        want is None
        or (
            ex.type_name,
            ex.durable,
            ex.auto_delete,
            ex.internal,
            ex.arguments,
        )
        == want
    )


def _binding_key(binding: Any) -> tuple[str, str, bool, str, str]:
    dest = binding.destination
    return (
        binding.source.name,
        dest.name,
        type(dest) is not Exchange,
        binding.routing_key,
        arguments_key(binding.arguments),
    )


def _bindings(vhost: VirtualHost) -> dict[tuple[str, str, bool, str, str], Any]:
    """Every binding of the vhost (the default exchange's are implicit) by its key."""
    return {
        _binding_key(b): b
        for ex in vhost.exchanges.values()
        if ex.name
        for b in ex.bindings.values()
    }


def _declare_ok(ch: Any, m: cmd.Queue.Declare) -> Callable[[tuple[str, int, int]], None]:
    def answer(result: tuple[str, int, int]) -> None:
        name, messages, consumers = result
        queue = ch.vhost.queues.get(name)
        if queue is not None and queue.exclusive_owner is ch.conn:
            ch.conn.exclusive_queues.add(queue)
        ch.last_queue_name = name
        if not m.nowait:
            ch.send_method(wire.unchecked(cmd.Queue.DeclareOk, name, messages, consumers))

    return answer


def _nothing(result: Any) -> None:
    pass


def _injected_sync_fault(path: str) -> None:
    """The test hook of SYNC_FAULTS_ENV: fail this sync as the file says."""
    try:
        with open(path, encoding="utf-8") as f:
            word = f.read().strip()
    except FileNotFoundError:
        return
    if word == "refuse":
        raise SyncRefused("refused (test fault)")
    if word.isdigit() and int(word) > 0:
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(int(word) - 1))
        raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (sync: test fault)")


def _log_failure(call: asyncio.Future[Any]) -> None:
    if not call.cancelled() and call.exception() is not None:
        log.warning(
            "a metadata change made here did not reach worker %d: %s", WRITER, call.exception()
        )


def _replicated(answer: Any) -> Any:
    """Worker 0's answer to a change, held on a worker of a leading cluster node until
    the node's followers hold what worker 0 wrote to its own definitions for it
    (`replica.NotLeading` once the node stops leading: the change is not to be reported
    as made). Without a cluster, the answer as it is."""
    tap: Any = replica.TAP
    if tap is None:
        return answer
    position = tap.sql_position

    async def wait() -> Any:
        value = await answer if isinstance(answer, asyncio.Future) else answer
        await tap.wait_safe(position)
        return value

    return asyncio.ensure_future(wait())
