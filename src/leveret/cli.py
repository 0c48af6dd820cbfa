"""The `leveret` command: `leveret server`, `leveret perf`."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path

from leveret import __version__, _build
from leveret.config import Listener, ServerConfig
from leveret.workers.count import DEFAULT as DEFAULT_WORKERS

log = logging.getLogger("leveret")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _lease_seconds(text: str) -> float:
    """--cluster-lease-seconds: etcd refuses leases shorter than a second or so."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 1:  # (also refuses nan)
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text}")
    return value


def _etcd_urls(text: str) -> str:
    """--cluster-etcd: every endpoint an http(s) URL, checked before the node starts
    (a bad one would otherwise be retried for ever)."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise argparse.ArgumentTypeError("expected http://HOST:PORT[,http://HOST:PORT...]")
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise argparse.ArgumentTypeError(
                f"expected http://HOST:PORT[,http://HOST:PORT...], got {url!r}"
            )
    return text


def _workers(text: str) -> int | str:
    """--workers: a whole number from 1, or `auto` (resolved in `_resolve_workers`)."""
    from leveret.workers.count import parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker_count(text: str) -> int:
    """`leveret reshard --workers`: a whole number from 1 (`auto` is no count to move to)."""
    value = _workers(text)
    if not isinstance(value, int):
        raise argparse.ArgumentTypeError("expected the new count, a whole number from 1")
    return value


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def _liveness_timeout(text: str) -> float:
    """--worker-liveness-timeout: seconds, 0 (off) or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):  # (also refuses nan)
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a positive number, got {text}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value


def _listen(text: str) -> Listener:
    """[amqp://|amqps://]HOST:PORT for --listen; IPv6 in brackets: [::1]:5672."""
    kind = "amqp"
    for scheme in ("amqp", "amqps"):
        if text.startswith(scheme + "://"):
            kind, text = scheme, text[len(scheme) + 3 :]
    listener = _host_port(text)
    return Listener(listener.host, listener.port, kind)


def _advertise(text: str) -> str:
    """--cluster-advertise: HOST:PORT as --listen takes it, kept as text."""
    _host_port(text)
    return text


def _host_port(text: str) -> Listener:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise argparse.ArgumentTypeError(
                f"expected [IPV6]:PORT, got {text!r} (the port goes after the bracket)"
            )
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
        if ":" in host:
            raise argparse.ArgumentTypeError(
                f"an IPv6 address needs brackets: [{host}]:{port_text}, got {text!r}"
            )
    try:
        port = _port(port_text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"bad port in {text!r}: {exc}") from None
    return Listener(host, port)


def _add_cluster_arguments(server: argparse.ArgumentParser) -> None:
    """High availability (docs/cluster.md): off unless --cluster-etcd is given."""
    cluster = server.add_argument_group("cluster (docs/cluster.md)")
    cluster.add_argument(
        "--cluster-etcd",
        type=_etcd_urls,
        metavar="URL[,URL...]",
        help="etcd endpoints (http://host:2379,...): run as a node of a cluster",
    )
    cluster.add_argument("--node-name", help="this node's name (default: the host name)")
    cluster.add_argument(
        "--cluster-name",
        help="the cluster's name, also RabbitMQ's cluster_name (default: leveret in a cluster)",
    )
    cluster.add_argument(
        "--cluster-port",
        type=_port,
        default=5679,
        help="the replication listener on --host (default %(default)s)",
    )
    cluster.add_argument(
        "--cluster-advertise",
        type=_advertise,
        metavar="HOST:PORT",
        help="where the other nodes reach this node's replication listener, when not at "
        "--host and --cluster-port (NAT, a Kubernetes Service, a proxy)",
    )
    cluster.add_argument(
        "--cluster-min-replicas",
        type=_positive_int,
        default=0,
        metavar="N",
        help="nodes (the leader included) that must hold a write before it is confirmed "
        "(default: a majority of the cluster's nodes)",
    )
    cluster.add_argument(
        "--cluster-lease-seconds",
        type=_lease_seconds,
        default=5.0,
        metavar="S",
        help="the leader's etcd lease: how soon a dead leader is replaced (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leveret", description="Leveret: a RabbitMQ-compatible AMQP 0-9-1 broker"
    )
    parser.add_argument("--version", action="version", version=f"leveret {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="run the broker")
    defaults = ServerConfig()
    server.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get("LEVERET_CONFIG"),
        help="a TOML file with any of these settings (docs/configuration.md); flags given "
        "here override it (default: $LEVERET_CONFIG)",
    )
    server.add_argument(
        "--host", default=defaults.host, help="address to listen on (default %(default)s)"
    )
    server.add_argument(
        "--port", type=_port, default=defaults.port, help="AMQP port (default %(default)s)"
    )
    server.add_argument(
        "--listen",
        type=_listen,
        action="append",
        metavar="HOST:PORT",
        help="listen here instead of --host/--port; repeat for several, e.g. "
        "--listen 127.0.0.1:5672 --listen [::1]:5672; amqps://HOST:PORT for TLS",
    )
    tls = server.add_argument_group("TLS (amqps)")
    tls.add_argument("--tls-cert", metavar="PEM", help="the broker's certificate (chain)")
    tls.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    tls.add_argument(
        "--tls-ca", metavar="PEM", help="CA certificates that sign client certificates"
    )
    tls.add_argument(
        "--tls-port",
        type=_port,
        default=5671,
        help="with --tls-cert, an amqps listener on --host and this port (default %(default)s)",
    )
    tls.add_argument(
        "--tls-verify",
        action="store_true",
        help="ask clients for a certificate (verified against --tls-ca); enables SASL EXTERNAL",
    )
    tls.add_argument(
        "--tls-fail-if-no-peer-cert",
        action="store_true",
        help="refuse clients without a valid certificate (implies --tls-verify)",
    )
    tls.add_argument(
        "--tls-cert-login-from",
        choices=["common_name", "distinguished_name"],
        default="common_name",
        help="the user name a client certificate gives (SASL EXTERNAL, "
        "--mqtt-ssl-cert-login): its CN, or its whole subject as RabbitMQ writes it, "
        "e.g. CN=guest,O=client (default %(default)s)",
    )
    server.add_argument(
        "--data-dir",
        default=defaults.data_dir,
        help="directory for durable state (default %(default)s)",
    )
    server.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default %(default)s)",
    )
    server.add_argument(
        "--heartbeat",
        type=_positive_int,
        default=defaults.heartbeat,
        help="heartbeat interval offered to clients, seconds; 0 disables (default %(default)s)",
    )
    server.add_argument(
        "--frame-max",
        type=_positive_int,
        default=defaults.frame_max,
        help="largest frame offered to clients (default %(default)s)",
    )
    server.add_argument(
        "--fsync",
        choices=["always", "batch", "never"],
        default=defaults.fsync,
        help="when persistent messages reach the disk: 'always' syncs each "
        "write, 'batch' (default) syncs once per group of writes before "
        "confirming them, 'never' leaves it to the OS (fast, a crash can "
        "lose confirmed messages)",
    )
    server.add_argument(
        "--max-memory-bytes",
        type=_positive_int,
        default=defaults.max_memory_bytes,
        help="message bodies beyond this budget are kept on disk "
        "(default: a quarter of RAM, %(default)s)",
    )
    server.add_argument(
        "--queue-ram-messages",
        type=_positive_int,
        default=defaults.queue_ram_messages,
        help="ready messages a queue keeps in RAM; past them a queue keeps only each "
        "message's place on disk (default %(default)s; 0: no limit per queue)",
    )
    server.add_argument(
        "--queue-ram-bytes",
        type=_positive_int,
        default=defaults.queue_ram_bytes,
        help="RAM for all queues' ready messages together, counting bodies and about "
        "400 B of bookkeeping each; past it every queue longer than 64 messages keeps "
        "new messages as their places on disk (default: an eighth of "
        "--max-memory-bytes, at most 128 MB, %(default)s)",
    )

    server.add_argument(
        "--busy-wait-us",
        type=_positive_int,
        default=defaults.busy_wait_us,
        metavar="US",
        help="after each read, keep polling instead of sleeping for this many "
        "microseconds: lower latency at moderate rates for up to a whole core of CPU "
        "(like Erlang's +sbwt; docs/benchmarks.md has figures); default %(default)s: "
        "off, as RabbitMQ 3.10",
    )
    server.add_argument(
        "--consumer-timeout-ms",
        type=_positive_int,
        default=defaults.consumer_timeout_ms,
        help="close a channel whose delivery stays unacknowledged this long, "
        "as RabbitMQ does; 0 disables (default %(default)s = 30 min)",
    )
    server.add_argument(
        "--quorum-delivery-limit",
        type=_positive_int,
        default=defaults.quorum_delivery_limit,
        metavar="N",
        help="delivery limit of quorum queues that set none (by x-delivery-limit or "
        "policy): RabbitMQ 4's default is 20; without this flag none, as RabbitMQ 3.10",
    )

    server.add_argument(
        "--memory-high-watermark",
        type=_positive_int,
        default=defaults.memory_high_watermark,
        help="resident memory (bytes) above which publishers are blocked "
        "(connection.blocked); 0 disables (default: 40%% of RAM, "
        "%(default)s)",
    )
    server.add_argument(
        "--disk-free-limit",
        type=_positive_int,
        default=defaults.disk_free_limit,
        help="free disk space (bytes) under --data-dir below which publishers "
        "are blocked; 0 disables (default %(default)s)",
    )

    server.add_argument(
        "--management-port",
        type=_port,
        default=15672,
        help="the management HTTP API's port on --host; 0 turns it off (default %(default)s)",
    )
    server.add_argument(
        "--prometheus-port",
        type=_port,
        default=15692,
        help="Prometheus metrics (/metrics, RabbitMQ's metric names) on --host; 0 turns "
        "them off (default %(default)s)",
    )
    mqtt = server.add_argument_group("MQTT (docs/mqtt.md)")
    mqtt.add_argument(
        "--mqtt-port",
        type=_port,
        default=1883,
        help="MQTT 3.1, 3.1.1 and 5.0 on --host; 0 turns it off (default %(default)s)",
    )
    mqtt.add_argument(
        "--web-mqtt-port",
        type=_port,
        default=15675,
        help="MQTT over WebSockets (ws://HOST:PORT/ws); 0 turns it off (default %(default)s)",
    )
    mqtt.add_argument(
        "--mqtt-tls-port",
        type=_port,
        default=8883,
        help="with --tls-cert, MQTT over TLS on this port; 0 turns it off (default %(default)s)",
    )
    mqtt.add_argument(
        "--mqtt-ssl-cert-login",
        action="store_true",
        help="on the MQTT TLS port, a CONNECT without user name and password logs in as "
        "the user its client certificate names (--tls-cert-login-from; needs --tls-verify "
        "and --tls-ca)",
    )
    server.add_argument(
        "--workers",
        type=_workers,
        default=DEFAULT_WORKERS,
        metavar="N|auto",
        help="run the broker as N worker processes under a supervisor, one core each "
        "(Linux; docs/workers.md); auto: one per CPU this process may use (its "
        "affinity and cgroup CPU quota), or the count an existing data dir was made "
        "with, 1 off Linux, with --cluster-etcd or on one CPU; default %(default)s"
        + (": one process" if DEFAULT_WORKERS == 1 else ""),
    )
    server.add_argument(
        "--worker-affinity",
        type=_on_off,
        default=defaults.worker_affinity,
        metavar="on|off",
        help="with --workers: move a connection to the worker that owns its queues "
        "(docs/workers.md#affinity); default on",
    )
    server.add_argument(
        "--worker-liveness-timeout",
        type=_liveness_timeout,
        default=defaults.worker_liveness_timeout,
        metavar="SECONDS",
        help="with --workers: a worker that answers none of the supervisor's pings for "
        "this long (its event loop is stuck) is killed and restarted; 0 turns the check "
        "off (docs/workers.md#liveness); default %(default)g",
    )
    server.add_argument(
        "--load-definitions",
        metavar="FILE",
        help="import a RabbitMQ definitions JSON file at every start (users, vhosts, "
        "permissions, queues, exchanges, bindings)",
    )
    _add_cluster_arguments(server)

    streams = sub.add_parser("streams", help="manage super streams on a running broker")
    streams_sub = streams.add_subparsers(dest="streams_command", required=True)
    for verb, text in (
        ("add-super-stream", "create a super stream: an exchange and N stream partitions"),
        ("delete-super-stream", "delete a super stream's partitions and exchanges"),
    ):
        cmd = streams_sub.add_parser(verb, help=text)
        cmd.add_argument("name")
        cmd.add_argument("--partitions", type=_partitions, required=True)
        cmd.add_argument(
            "--url",
            default="amqp://guest:guest@127.0.0.1:5672/%2F",
            help="the broker (default %(default)s)",
        )
        if verb == "add-super-stream":
            cmd.add_argument(
                "--consistent-hash",
                action="store_true",
                help="also create NAME-hash, an x-consistent-hash exchange over the partitions",
            )

    reshard = sub.add_parser(
        "reshard",
        help="change a stopped broker's worker count: move each queue's stored messages "
        "to the store of its new owner (docs/workers.md#changing-the-worker-count)",
    )
    reshard.add_argument("--data-dir", required=True, help="the broker's data dir")
    reshard.add_argument(
        "--workers",
        type=_worker_count,
        required=True,
        help="the new count (1: one process, the data dir's store in the dir itself)",
    )

    from leveret import ctl as ctl_module

    ctl_module.add_arguments(
        sub.add_parser("ctl", help="manage a running broker: vhosts, users, permissions, ...")
    )

    perf = sub.add_parser("perf", help="measure an AMQP broker's throughput and latency")
    try:
        from leveret import perf as perf_module

        perf_module.add_arguments(perf)
    except ImportError:  # pragma: no cover - perf is part of the package
        pass
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "server":
        args.explicit = _explicit_flags(argv)
        return run_server(args)
    if args.command == "streams":
        return run_streams(args)
    if args.command == "reshard":
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        from leveret.workers.reshard import main as reshard_main

        return reshard_main(str(Path(args.data_dir)), args.workers)
    if args.command == "ctl":
        from leveret import ctl as ctl_module

        return ctl_module.run(args)
    if args.command == "perf":
        from leveret import perf as perf_module

        return perf_module.run(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _partitions(text: str) -> int:
    value = _positive_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a super stream needs at least 1 partition, got {value}")
    return value


def run_streams(args: argparse.Namespace) -> int:
    from leveret.client.errors import ClientError
    from leveret.super_streams import create_super_stream, delete_super_stream

    try:
        if args.streams_command == "add-super-stream":
            names = create_super_stream(
                args.url, args.name, args.partitions, hash_exchange=args.consistent_hash
            )
            print(f"super stream '{args.name}': partitions {', '.join(names)}")
        else:
            delete_super_stream(args.url, args.name, args.partitions)
            print(f"super stream '{args.name}' deleted")
    except (ClientError, OSError) as exc:
        print(f"leveret streams: {exc}", file=sys.stderr)
        return 1
    return 0


def _explicit_flags(argv: list[str] | None) -> set[str]:
    """The `leveret server` options given on the command line (they override the file)."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in subparsers.choices["server"]._actions:
        action.default = argparse.SUPPRESS
    given = parser.parse_args(argv)
    return set(vars(given)) - {"command"}


# `leveret server` options that are ServerConfig fields of another name.
FLAG_FIELDS = {"listen": "listeners"}


def _apply_config_file(args: argparse.Namespace) -> None:
    """Settings from --config where no flag was given; ConfigFileError if the file is bad."""
    from leveret.config_file import load

    values = load(args.config)
    explicit = getattr(args, "explicit", set())
    flags = {FLAG_FIELDS.get(dest, dest): dest for dest in vars(args)}
    args.extra_settings = {}
    for field, value in values.items():
        dest = flags.get(field)
        if dest is None:
            args.extra_settings[field] = value  # a setting with no flag
        elif dest not in explicit:
            setattr(args, dest, value)


def run_server(args: argparse.Namespace) -> int:
    args.extra_settings = {}
    if args.config:
        from leveret.config_file import ConfigFileError

        try:
            _apply_config_file(args)
        except ConfigFileError as exc:
            print(f"leveret server: bad config file: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.frame_max and args.frame_max < 4096:
        log.error("--frame-max must be at least 4096 (the AMQP minimum), got %d", args.frame_max)
        return 2
    tls_given = bool(args.tls_cert or args.tls_key)
    if tls_given and not (args.tls_cert and args.tls_key):
        log.error("TLS needs both --tls-cert and --tls-key")
        return 2
    wants_tls = args.tls_verify or args.tls_fail_if_no_peer_cert or args.tls_ca
    amqps = any(listener.kind == "amqps" for listener in args.listen or [])
    if (wants_tls or amqps) and not tls_given:
        log.error("--tls-verify, --tls-ca and amqps:// listeners need --tls-cert and --tls-key")
        return 2
    if args.mqtt_ssl_cert_login and not (tls_given and args.mqtt_tls_port):
        log.error("--mqtt-ssl-cert-login needs the MQTT TLS listener: --tls-cert and --tls-key "
                  "(and --mqtt-tls-port not 0)")  # fmt: skip
        return 2
    if args.mqtt_ssl_cert_login and not (args.tls_verify or args.tls_fail_if_no_peer_cert):
        log.error("--mqtt-ssl-cert-login needs client certificates: --tls-verify (or "
                  "--tls-fail-if-no-peer-cert) and --tls-ca")  # fmt: skip
        return 2
    # Here, once logging is set up: the fallback runs slower, and a build that fell back
    # (no compiler, stale modules) says so nowhere else an operator looks.
    level, line = _build.hot_path()
    log.log(level, "%s", line)
    workers = _resolve_workers(args)
    if workers is None:
        return 2
    config = ServerConfig(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        tls_verify=args.tls_verify or args.tls_fail_if_no_peer_cert,
        tls_fail_if_no_peer_cert=args.tls_fail_if_no_peer_cert,
        tls_cert_login_from=args.tls_cert_login_from,
        tls_port=args.tls_port if tls_given else None,
        host=args.host,
        port=args.port,
        listeners=args.listen or [],
        data_dir=str(Path(args.data_dir)),
        heartbeat=args.heartbeat,
        frame_max=args.frame_max or ServerConfig.frame_max,
        fsync=args.fsync,
        max_memory_bytes=args.max_memory_bytes,
        queue_ram_messages=args.queue_ram_messages,
        queue_ram_bytes=args.queue_ram_bytes,
        consumer_timeout_ms=args.consumer_timeout_ms,
        busy_wait_us=args.busy_wait_us,
        quorum_delivery_limit=args.quorum_delivery_limit,
        memory_high_watermark=args.memory_high_watermark,
        disk_free_limit=args.disk_free_limit,
        load_definitions=args.load_definitions,
        management_port=args.management_port or None,
        prometheus_port=args.prometheus_port or None,
        mqtt_port=args.mqtt_port or None,
        web_mqtt_port=args.web_mqtt_port or None,
        mqtt_tls_port=(args.mqtt_tls_port or None) if tls_given else None,
        mqtt_ssl_cert_login=args.mqtt_ssl_cert_login,
        cluster_etcd=args.cluster_etcd,
        **({"cluster_name": args.cluster_name} if args.cluster_name else {}),
        node_name=args.node_name,
        cluster_port=args.cluster_port,
        cluster_advertise=args.cluster_advertise,
        cluster_min_replicas=args.cluster_min_replicas,
        cluster_lease_seconds=args.cluster_lease_seconds,
        workers=workers,
        worker_affinity=args.worker_affinity,
        worker_liveness_timeout=args.worker_liveness_timeout,
        **args.extra_settings,
    )
    if config.workers != 1:
        return _run_workers(config, args.log_level)
    from leveret.workers.serve import WorkersError, check_layout

    try:
        check_layout(config.data_dir, 1)  # a data dir of workers is not one process's
    except WorkersError as exc:
        log.error("cannot start: %s", exc)
        return 2
    use_uvloop(config)
    return run_until_stopped(config, lambda: _serve(config))


def _resolve_workers(args: argparse.Namespace) -> int | None:
    """The worker count for --workers (a number or `auto`, workers/count.py), the
    reason for an `auto` count logged; None (logged) if the data dir's record cannot
    be read."""
    from leveret.workers.count import AUTO, resolve
    from leveret.workers.reshard import complete
    from leveret.workers.serve import WorkersError

    try:
        if os.path.isdir(args.data_dir):
            complete(str(Path(args.data_dir)))  # a re-shard decided but not done
        resolution = resolve(args.workers, str(Path(args.data_dir)), bool(args.cluster_etcd))
    except WorkersError as exc:
        log.error("cannot start: %s", exc)
        return None
    if args.workers == AUTO:
        log.info("--workers auto: %s", resolution.reason)
    return resolution.count


def _run_workers(config: ServerConfig, log_level: str) -> int:
    """`--workers N`, N > 1: this process supervises N worker processes."""
    if not sys.platform.startswith("linux"):
        log.error(
            "--workers %d needs Linux (SO_REUSEPORT spreading and descriptor passing); "
            "run --workers 1 here",
            config.workers,
        )
        return 2
    if config.cluster_etcd:
        # One node of the cluster, its workers started while it leads (docs/cluster.md)
        return run_until_stopped(config, lambda: _serve_cluster_node(config))
    from leveret.workers.serve import WorkersError, serve

    try:
        return run_until_stopped(config, lambda: serve(config, log_level))
    except WorkersError as exc:
        log.error("cannot start: %s", exc)
        return 2


def use_uvloop(config: ServerConfig) -> None:
    """Run on uvloop, unless a TLS listener is configured."""
    if any(listener.kind == "amqps" for listener in config.effective_listeners()):
        # uvloop's start_tls (server/tls.py) intermittently leaves handshakes hanging
        # here; asyncio's loop completes every one, so TLS brokers run on it.
        log.info("TLS listener configured: running on asyncio's event loop, not uvloop")
    else:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass


def run_until_stopped(config: ServerConfig, main: Callable[[], Awaitable[int]]) -> int:
    """Run `main()` in a new event loop; a failure to start is logged as what it is
    (the data dir, the configuration, a port) and becomes the exit status."""
    from leveret.broker.errors import ModelError
    from leveret.server.tls import TLSConfigError
    from leveret.store.errors import StoreError

    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except StoreError as exc:
        log.error("cannot start: the data dir %s cannot be used: %s", config.data_dir, exc)
        return 2
    except (ModelError, TLSConfigError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        if exc.errno == errno.EADDRINUSE:
            # Most often a RabbitMQ on the same machine, which holds 5672, 15672, 15692.
            log.error(
                "another process listens there (a RabbitMQ?); pick free ports with "
                "--port (or --listen), --management-port, --prometheus-port, --mqtt-port "
                "and --web-mqtt-port"
            )
        return 1


async def _serve_cluster_node(config: ServerConfig) -> int:
    from leveret.cluster.node import ClusterNode

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return await ClusterNode(config, loop).run(stop)


async def _serve(config: ServerConfig) -> int:
    from leveret.launcher import Node
    from leveret.server import gc_tuning

    loop = asyncio.get_running_loop()
    if config.cluster_etcd:
        return await _serve_cluster_node(config)
    server = Node(config, loop=loop)
    # Handlers first: a SIGTERM that arrives while start() finishes (the port already
    # listens) must still stop the broker cleanly.
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start(wait_for_recovery=False)  # listen first; messages come back after
    gc_tuning.tune()  # fewer, cheaper cycle collections; see the module for figures
    stopping = asyncio.ensure_future(stop.wait())
    recovery = server.recovery
    if recovery is not None:
        await asyncio.wait({recovery, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if recovery.done() and not recovery.cancelled() and recovery.exception() is not None:
            await server.stop()  # the data dir failed to load: main() names the problem
            raise recovery.exception()  # type: ignore[misc]
    await stopping
    log.info("shutting down: closing %d connection(s)", len(server.connections))
    await server.stop()
    return 0
