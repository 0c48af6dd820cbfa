"""Server settings, shared by the CLI, the embedded test broker and the server."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _default_queue_ram_bytes() -> int:
    """An eighth of the body budget, at most 128 MB: the heads of long queues need
    only enough to keep consumers fed (each refills 256 messages at a time)."""
    return min(_default_memory_budget() // 8, 128 * 1024 * 1024)


def _default_memory_budget() -> int:
    """A quarter of physical RAM, as RabbitMQ's paging threshold is a fraction of it."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return max(64 * 1024 * 1024, pages * page_size // 4)
    except (ValueError, OSError, AttributeError):
        return 1024 * 1024 * 1024


@dataclass(frozen=True)
class Listener:
    """One address the broker accepts connections on (`--listen HOST:PORT`)."""

    host: str
    port: int
    kind: str = "amqp"  # "amqp" (plain TCP) or "amqps" (TLS, see ServerConfig.tls_*)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 5672
    # Explicit listeners; when empty the broker listens on host:port alone.
    listeners: list[Listener] = field(default_factory=list)
    data_dir: str = "./leveret-data"
    # Values offered in connection.tune; a client's lower non-zero value wins.
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    # A connection that has not finished connection.open by then is dropped.
    handshake_timeout: float = 10.0
    # Created on the first start only (an empty catalog), as RabbitMQ's
    # default_user / default_pass / default_vhost; later starts keep what is stored.
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    # Users who may log in from loopback addresses only (RabbitMQ's loopback_users).
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # Seconds a failed login waits before the close, to slow password guessing
    # (RabbitMQ's reader sleeps 3 s before closing a failed handshake).
    auth_failure_delay: float = 3.0
    # A RabbitMQ definitions JSON file imported at every boot (load_definitions).
    load_definitions: str | None = None
    # TLS for "amqps" listeners: PEM files. tls_verify asks for a client
    # certificate; tls_fail_if_no_peer_cert refuses clients without one.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_verify: bool = False
    tls_fail_if_no_peer_cert: bool = False
    # The user name a verified client certificate gives (SASL EXTERNAL, MQTT's
    # certificate login): "common_name" or "distinguished_name" (leveret.auth.sasl).
    tls_cert_login_from: str = "common_name"
    # The management HTTP API on host:management_port; None: off (the CLI's default is 15672).
    management_port: int | None = None
    # Prometheus /metrics on host:prometheus_port; None: off (the CLI's default is 15692).
    prometheus_port: int | None = None
    # With host:port (no explicit listeners): also an amqps listener on this port.
    tls_port: int | None = None
    fsync: str = "batch"  # always | batch | never
    max_memory_bytes: int = field(default_factory=_default_memory_budget)
    # Ready messages a queue without TTL, length limits or priorities keeps in RAM;
    # past them it keeps each message as its place on disk only (0: no such limit).
    queue_ram_messages: int = 8192
    # All queues' heads together (ready messages kept as objects: bodies plus about
    # 400 B of bookkeeping each); past it long queues page whatever their own length.
    queue_ram_bytes: int = field(default_factory=lambda: _default_queue_ram_bytes())
    # Disable disk persistence entirely (the embedded test broker uses this by default).
    persistence: bool = True
    consumer_timeout_ms: int = 30 * 60 * 1000
    # After each read the event loop polls instead of sleeping for this long (µs):
    # lower latency at moderate rates for a busy core (server/busy_wait.py). 0: off,
    # as RabbitMQ 3.10 runs Erlang (+sbwt none).
    busy_wait_us: int = 0
    # Quorum queues' delivery limit when none is declared or set by policy. None: no
    # limit, as RabbitMQ 3.10; RabbitMQ 4 has 20.
    quorum_delivery_limit: int | None = None
    # Resource alarms (connection.blocked): RSS above this blocks publishers (0 = off);
    # RabbitMQ's default watermark is 40% of RAM.
    memory_high_watermark: int = field(default_factory=lambda: _default_memory_budget() * 8 // 5)
    disk_free_limit: int = 50 * 1024 * 1024  # bytes free under data_dir, as RabbitMQ
    # This broker's name to other brokers (RabbitMQ's cluster_name): the server
    # property, shovels' shovelled-by, federation's loop detection. None: a name made
    # on the first start and kept in the data dir ("leveret-<6 hex>@<host>").
    cluster_name: str | None = None
    # Static shovels (the config file's [shovels.NAME] tables), name → definition
    # with the keys of a dynamic shovel's value; they run in vhost "/".
    shovels: dict[str, dict] = field(default_factory=dict)
    # A cluster (leveret.cluster, docs/cluster.md): off unless cluster_etcd names etcd
    # endpoints ("http://host:2379,..."); then the node leads or follows.
    cluster_etcd: str | None = None
    node_name: str | None = None  # None: the host name
    # (cluster_name above names the cluster too: "leveret" when clustering and unset)
    cluster_port: int = 5679  # the replication listener, on host
    # HOST:PORT the other nodes reach that listener at, when not host:cluster_port
    # (NAT, a Kubernetes Service, a proxy); None: host and cluster_port
    cluster_advertise: str | None = None
    cluster_min_replicas: int = 0  # 0: a majority of the cluster's nodes
    cluster_lease_seconds: float = 5.0
    # MQTT (leveret.mqtt, docs/mqtt.md) on host:mqtt_port, MQTT over WebSockets on
    # host:web_mqtt_port (path /ws) and MQTT over TLS on host:mqtt_tls_port (with the
    # tls_* files); None: off (the CLI's defaults are 1883, 15675 and, with TLS, 8883).
    mqtt_port: int | None = None
    web_mqtt_port: int | None = None
    mqtt_tls_port: int | None = None
    # RabbitMQ's mqtt.exchange, mqtt.vhost (for user names without "vhost:"),
    # mqtt.prefetch, mqtt.subscription_ttl (ms; 0: none) and mqtt.allow_anonymous with
    # mqtt.default_user / default_pass (who a CONNECT without credentials logs in as).
    mqtt_exchange: str = "amq.topic"
    mqtt_vhost: str = "/"
    mqtt_prefetch: int = 10
    mqtt_subscription_ttl_ms: int = 86_400_000
    mqtt_allow_anonymous: bool = True
    mqtt_default_user: str = "guest"
    mqtt_default_pass: str = "guest"
    # MQTT 5: the longest session expiry granted (RabbitMQ 3.13's
    # max_session_expiry_interval_seconds) and the topic aliases a client may use.
    mqtt_max_session_expiry: int = 86_400
    mqtt_topic_alias_maximum: int = 16
    # RabbitMQ's mqtt.ssl_cert_login: on the MQTT TLS listener, a CONNECT without user
    # name and password logs in as the user its verified client certificate names
    # (tls_cert_login_from, as SASL EXTERNAL); needs tls_verify and tls_ca.
    mqtt_ssl_cert_login: bool = False
    # Worker processes (leveret.workers, docs/workers.md): 1 is one process, as
    # always; more (Linux) is a supervisor and that many workers, each one core.
    # The count itself: `leveret server` resolves --workers auto (and the config
    # file's workers = "auto") to one before it builds this (workers/count.py).
    workers: int = 1
    # With workers: a plain-TCP connection whose queues one other worker owns moves
    # to that worker (workers/affinity.py); off, every connection stays where the
    # kernel put it and its messages cross between workers.
    worker_affinity: bool = True
    # With workers: seconds a ready worker may answer none of the supervisor's
    # liveness pings before it is killed and restarted (workers/liveness.py); 0 off.
    worker_liveness_timeout: float = 30.0

    def effective_listeners(self) -> list[Listener]:
        """What the server binds: the explicit listeners, else host:port."""
        if self.listeners:
            return list(self.listeners)
        listeners = [Listener(self.host, self.port)]
        if self.tls_port is not None:
            listeners.append(Listener(self.host, self.tls_port, "amqps"))
        return listeners
