"""The broker: virtual hosts, users and their connections, independent of any network code."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable
from typing import Any, Protocol

from leveret.auth.users import AccessControl
from leveret.broker.admin import Admin
from leveret.broker.direct_reply import DirectReplyRegistry
from leveret.broker.durability import DurabilityHooks
from leveret.broker.global_parameters import CLUSTER_NAME, GlobalParameters
from leveret.broker.parameters import RuntimeParameters
from leveret.broker.ports import Extension
from leveret.broker.stats import NodeCounters
from leveret.broker.vhost import VirtualHost
from leveret.config import ServerConfig


class ClientConnection(Protocol):
    """What the model needs of an open client connection (the server's AMQPConnection)."""

    user: str | None
    vhost: Any  # VirtualHost once open

    def force_close(self, reason: str = "shutdown", text: str | None = None) -> None:
        """Close with 320 CONNECTION_FORCED; `text` replaces the default reply text."""

    def access_changed(self) -> None:
        """Permissions or tags of this connection's user changed: look them up again."""


class Broker:
    def __init__(
        self,
        config: ServerConfig,
        hooks: DurabilityHooks | None = None,
        extensions: Iterable[Extension] = (),
    ) -> None:
        self.config = config
        self.hooks = hooks or DurabilityHooks()
        self.access = AccessControl()
        self.vhosts: dict[str, VirtualHost] = {}
        # Open (connection.open done) client connections, for vhost limits and for
        # closing or re-checking them when their vhost or user changes.
        self.connections: set[ClientConnection] = set()
        self.mqtt: Any = None  # the server's leveret.mqtt.listener.MQTTListeners, if serving MQTT
        self.direct_reply = DirectReplyRegistry()
        # Opened since start (closed = opened - open now); read by the Prometheus metrics.
        self.connections_opened = 0
        self.channels_opened = 0
        # Watchers of every vhost's topology and policies (VirtualHost.watchers).
        self.vhost_watchers: list[Any] = []
        self.counters = NodeCounters()  # node totals that outlive their objects (Prometheus)
        # A worker's data path to queues other workers own (leveret.workers.crossing),
        # given to every vhost; None for a broker that is one process.
        self.crossing: Any = None
        self.admin = Admin(self)
        self.admin.load()
        # Runtime parameters (shovels, federation upstreams): their components come
        # from the extensions (leveret.links), registered before the stored ones load.
        records = self.hooks.catalog_load() or {}
        self.parameters = RuntimeParameters(self)
        for extend in extensions:
            extend(self)
        self.parameters.load(records)
        # RabbitMQ's global parameters: cluster_name (once set), internal_cluster_id.
        self.global_parameters = GlobalParameters(self.hooks, records)
        self.default_cluster_name = config.cluster_name or self._cluster_name(records)
        # Made once from the name the broker had when it was first made (what
        # Prometheus showed before it was stored), so upgrades keep their id.
        digest = hashlib.sha256(self.cluster_name.encode()).hexdigest()[:22]
        self.global_parameters.cluster_id(f"leveret-cluster-id-{digest}")
        self.links: Any = None  # the server's leveret.links.manager.LinkManager, once running
        # When this broker is one worker of several (leveret.workers): its
        # leveret.workers.mesh.Mesh (index, count, owner_of, call, send). Set by the
        # launcher; None for a broker that is one process.
        self.mesh: Any = None
        # With a mesh: its leveret.workers.metadata.Metadata, through which every
        # metadata change reaches every worker in one order. Set by the launcher.
        self.meta: Any = None
        # A worker of several: connection limits counted over the whole broker
        # (workers/limits.py's LimitCounts). None: one process.
        self.limit_counts: Any = None

    @property
    def cluster_name(self) -> str:
        """RabbitMQ's cluster_name: the global parameter once set (PUT /api/cluster-name),
        else the default. Read when it is used (a new connection's server properties,
        a scrape, a federation hop), so a change applies from then on."""
        return self.global_parameters.values.get(CLUSTER_NAME, self.default_cluster_name)

    @property
    def cluster_id(self) -> str:
        """RabbitMQ's internal_cluster_id (Prometheus' rabbitmq_cluster_permanent_id)."""
        return self.global_parameters.cluster_id()

    def _cluster_name(self, records: dict[str, Any]) -> str:
        """Made once and kept: other brokers tell this one apart by it (federation)."""
        stored = records.get("cluster", {}).get("name")
        if stored is not None:
            return stored["name"]
        name = f"leveret-{os.urandom(3).hex()}@{socket.gethostname()}"
        self.hooks.catalog_put("cluster", "name", {"name": name})
        return name

    def authenticate(self, username: str, password: str) -> bool:
        return self.access.authenticate(username, password) is not None

    def authenticate_external(self, username: str) -> bool:
        """SASL EXTERNAL: the certificate names a user that exists."""
        return username in self.access.users

    def client_connections(self) -> list:
        """Every open client connection, AMQP and MQTT: what the overview's object totals
        and Prometheus' connection metrics count (RabbitMQ 3.10's MQTT plugin registers
        its connections in the same tables as AMQP ones, so they count there too)."""
        if self.mqtt is None:
            return list(self.connections)
        return [*self.connections, *self.mqtt.open_connections()]

    def connections_of(self, *, user: str | None = None, vhost: str | None = None) -> list:
        """Open client connections of a user and/or vhost: AMQP ones and, when the broker
        serves MQTT, MQTT ones (for limits, access changes, closes and listings)."""
        conns = self.connections
        if self.mqtt is not None:
            conns = [*conns, *self.mqtt.open_connections()]
        return [
            c
            for c in conns
            if (user is None or c.user == user)
            and (vhost is None or (c.vhost is not None and c.vhost.name == vhost))
        ]
