"""The node as the packages beside the broker reach it: a `typing.Protocol`.

The management API, the Prometheus endpoint, links and the cluster leader need the
running node (its broker, its AMQP listeners, its store, each other); the launcher
(`leveret.launcher.Node`) builds the node and hands itself to them. They type what
they get as `NodeHandle`, declared here below all of them, so that none of them
imports the launcher that imports them (tests/unit/test_layering.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from leveret.broker.broker import Broker
    from leveret.config import ServerConfig
    from leveret.persistence.durable_state import DurableState
    from leveret.server.alarms import ResourceAlarms
    from leveret.server.connection import AMQPConnection
    from leveret.server.listener import Server


class NodeHandle(Protocol):
    """One running node: what the launcher built, read by what it built beside it."""

    config: ServerConfig
    loop: asyncio.AbstractEventLoop
    broker: Broker
    listener: Server  # the AMQP listeners; links join their in-memory connections to it
    durable_state: DurableState | None  # None without persistence (and once stopped)
    started_at: float  # time.monotonic() when the node last started
    management: Any  # leveret.management.app.ManagementServer while it runs
    prometheus: Any  # leveret.management.prometheus.PrometheusServer while it runs
    links: Any  # leveret.links.manager.LinkManager once started
    cluster: Any  # leveret.cluster.node.ClusterNode when this node leads a cluster
    # leveret.management.workers.WorkerStats when the node is one of several workers
    worker_stats: Any

    @property
    def recovering(self) -> bool:
        """True while stored messages are read back (client operations wait)."""

    @property
    def connections(self) -> set[AMQPConnection]:
        """The AMQP connections open now, in-memory (links) ones included."""

    @property
    def alarms(self) -> ResourceAlarms | None:
        """The memory and disk alarms, once started."""

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each AMQP listener, as bound."""

    async def wait_recovered(self) -> None:
        """Return once stored messages are back."""
