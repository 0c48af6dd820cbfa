"""`leveret server --workers N`: the supervisor process of a broker made of N workers.

The `leveret server` process binds the broker's AMQP ports, one `SO_REUSEPORT`
socket per worker on each (`sockets.listening_group`), and runs the workers under a
`supervisor.Supervisor`. It serves no client itself. For each start of worker `i`:

- a control channel (`control.py`): the worker's end goes with the listening
  sockets as passed descriptors (`python -m leveret.worker`), the settings
  in the environment (`LEVERET_WORKER_CONFIG`);
- a new mesh socket pair with each other worker that runs (or is starting): one end
  to each by SCM_RIGHTS on their control channels, so a restarted worker links to
  the live ones and they replace their broken link to it;
- its own settings (`worker_config`): its store in `<data-dir>/worker-<i>`, the
  listeners resolved to the ports bound here (port 0 included), a share of the
  memory budgets; the management API, Prometheus, MQTT over TLS and WebSockets, the
  definitions file and the static shovels on worker 0 only. MQTT over TCP has a
  socket group of its own, as the AMQP ports: every worker accepts on it.

Each worker reports when it is up (its stored messages back), then its links (by
the pair numbers made here) and its sync with worker 0; this process tells it to
accept clients (`_serve_when_linked`): at the broker's start all workers at once,
when every one is linked to every other and in sync, and later a restarted worker
once it is. Once every worker said it accepts, this process logs the "Leveret
listening for AMQP" lines a one-process broker logs. SIGTERM or SIGINT stop every worker (each
closes its clients with 320 CONNECTION_FORCED) and return 0; a worker that exits
before it ever served stops the others and makes the exit status non-zero.

`<data-dir>/workers.json` records the broker's worker count and the cluster name
that every worker gives clients: a count that differs from the recorded one is
refused, since each worker's store holds the queues of its own share
(`leveret reshard`, `workers/reshard.py`, changes it offline).
`<data-dir>/workers-status.json` has each worker's pid, state, restarts, last exit
status and readiness (the supervisor's status file).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import pickle
import signal
import socket
import sys

from leveret.config import Listener, ServerConfig
from leveret.workers.control import EventReader, send_link, send_ping, send_serve
from leveret.workers.sockets import ListeningGroup, listening_group, mesh_pair
from leveret.workers.supervisor import Supervisor

log = logging.getLogger("leveret.workers")

#: the environment variable a worker reads its settings from (a pickled ServerConfig)
CONFIG_ENV = "LEVERET_WORKER_CONFIG"
#: the broker-wide record in the top data dir
LAYOUT_FILE = "workers.json"
#: each worker's pid, state, restarts and readiness, rewritten at every change
STATUS_FILE = "workers-status.json"


class WorkersError(Exception):
    """The workers cannot start as asked (the message says why)."""


def worker_dir(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, f"worker-{index}")


def read_layout(data_dir: str) -> dict | None:
    """The data dir's worker record (`workers.json`), None if it has none;
    WorkersError if it cannot be read."""
    path = os.path.join(data_dir, LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise WorkersError(f"{path} cannot be read: {exc}") from None


def check_layout(data_dir: str, count: int) -> dict:
    """The data dir's worker record, made on the first start of a broker of workers.

    A data dir made by one process has no record and is refused for several workers
    (its queues are in the top dir, which no worker reads), as is one made by a
    different number of workers. WorkersError says which."""
    doc = read_layout(data_dir)
    if doc is None:
        if count == 1:
            return {}
        if holds_a_store(data_dir):
            raise WorkersError(
                f"the data dir {data_dir} holds a one-process broker's store; "
                f"--workers {count} would not read it (start it with --workers 1, or "
                f"change its count first: leveret reshard --data-dir {data_dir} "
                f"--workers {count})"
            )
        return {}
    recorded = doc.get("workers") if isinstance(doc, dict) else None
    if recorded != count:
        raise WorkersError(
            f"the data dir {data_dir} belongs to a broker of --workers {recorded}; "
            f"start it with --workers {recorded} or --workers auto, or change its count "
            f"first: leveret reshard --data-dir {data_dir} --workers {count}"
        )
    return doc


def holds_a_store(data_dir: str) -> bool:
    """Whether a one-process broker kept its store here (its definitions catalog)."""
    return os.path.exists(os.path.join(data_dir, "definitions.db"))


def write_layout(data_dir: str, doc: dict) -> None:
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, LAYOUT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def worker_config(
    config: ServerConfig,
    groups: list[ListeningGroup],
    index: int,
    mqtt: ListeningGroup | None = None,
) -> ServerConfig:
    """Worker `index`'s settings: its store dir, the ports as bound, its share."""
    count = config.workers
    first = index == 0
    changes: dict = {
        "data_dir": worker_dir(config.data_dir, index),
        "management_port": config.management_port if first else None,
        "prometheus_port": config.prometheus_port if first else None,
        # MQTT over TCP: every worker accepts on the group's port; TLS and WebSockets
        # on worker 0
        "mqtt_port": mqtt.port if mqtt is not None else None,
        "web_mqtt_port": config.web_mqtt_port if first else None,
        "mqtt_tls_port": config.mqtt_tls_port if first else None,
        # (client certificates log in on the TLS listener, worker 0's)
        "mqtt_ssl_cert_login": config.mqtt_ssl_cert_login if first else False,
        "load_definitions": config.load_definitions if first else None,
        "shovels": config.shovels if first else {},
        # The budgets are the broker's: each worker gets its share.
        "max_memory_bytes": config.max_memory_bytes // count,
        "queue_ram_bytes": config.queue_ram_bytes // count,
        "memory_high_watermark": config.memory_high_watermark // count,
    }
    if config.listeners:
        changes["listeners"] = [Listener(g.host, g.port, g.kind) for g in groups]
    else:
        changes["port"] = groups[0].port
        if config.tls_port is not None:
            changes["tls_port"] = groups[1].port
    return dataclasses.replace(config, **changes)


def encode_config(config: ServerConfig) -> str:
    return base64.b64encode(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def decode_config(text: str) -> ServerConfig:
    config = pickle.loads(base64.b64decode(text))
    if not isinstance(config, ServerConfig):
        raise ValueError(f"{CONFIG_ENV} does not hold a ServerConfig")
    return config


class Workers:
    """The supervisor's side of the broker: sockets, control channels, readiness."""

    #: SIGTERM and SIGINT stop the workers (a cluster node handles them itself)
    handle_signals = True

    def __init__(self, config: ServerConfig, log_level: str = "info") -> None:
        self.config = config
        self.count = config.workers
        self.log_level = log_level
        self.groups: list[ListeningGroup] = []
        self.mqtt_group: ListeningGroup | None = None  # MQTT over TCP, when configured
        self.configs: list[ServerConfig] = []
        self.controls: dict[int, socket.socket] = {}  # this process's end, per worker
        self._child_ends: dict[int, socket.socket] = {}  # closed once the worker runs
        self.members: set[int] = set()  # workers started or starting, that get links
        # Each socket pair between two workers has a number (the latest per pair of
        # workers is the live one), and each worker reports the numbers of the links
        # it runs and whether it is in sync with worker 0 (`_linked`).
        self.pairs: dict[frozenset[int], int] = {}
        self._next_pair = 0
        self.links: dict[int, dict] = {}  # worker -> its last report, this start
        self.told: set[int] = set()  # workers told to serve, this start
        self.serving = False  # the broker serves: every worker was told once
        self.announced = False
        self.supervisor: Supervisor | None = None

    def bind(self) -> None:
        """Every listener's socket group (OSError: a port is taken)."""
        try:
            for listener in self.config.effective_listeners():
                self.groups.append(
                    listening_group(listener.host, listener.port, listener.kind, self.count)
                )
            if self.config.mqtt_port is not None:
                self.mqtt_group = listening_group(
                    self.config.host, self.config.mqtt_port, "mqtt", self.count
                )
        except BaseException:
            self.close()
            raise

    async def run(self) -> int:
        doc = check_layout(self.config.data_dir, self.count)
        self.bind()  # before the data dir is marked as a broker of workers
        # The name a one-process broker makes on its first start and keeps; every
        # worker gives it (--cluster-name overrides it, as for one process).
        stored = doc.get("cluster_name")
        if not doc:
            stored = f"leveret-{os.urandom(3).hex()}@{socket.gethostname()}"
            try:
                write_layout(self.config.data_dir, {"workers": self.count, "cluster_name": stored})
            except BaseException:
                self.close()
                raise
        cluster_name = self.config.cluster_name or stored
        self.config = dataclasses.replace(self.config, cluster_name=cluster_name)
        self.configs = [
            worker_config(self.config, self.groups, i, self.mqtt_group) for i in range(self.count)
        ]
        loop = asyncio.get_running_loop()
        sup = self.supervisor = Supervisor(
            self.count,
            self.command,
            pass_fds=self.pass_fds,
            on_start=self.on_start,
            on_spawned=self.on_spawned,
            on_exit=self.on_exit,
            worker_env=lambda i: {CONFIG_ENV: encode_config(self.configs[i])},
            require_ready=True,
            new_session=True,
            status_file=os.path.join(self.config.data_dir, STATUS_FILE),
            # A restarted worker reads its store back: give it time before SIGKILL.
            stop_timeout=30.0,
            liveness_timeout=self.config.worker_liveness_timeout,
            ping=self._ping,
        )
        signals = (signal.SIGTERM, signal.SIGINT) if self.handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._stop)
        try:
            rc = await sup.run()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            self.close()
        log.info("Leveret stopped (%d workers)", self.count)
        return rc

    def _stop(self) -> None:
        log.info("shutting down: stopping %d workers", self.count)
        assert self.supervisor is not None
        self.supervisor.stop()

    # --- one worker's start -----------------------------------------------------------

    def command(self, index: int) -> list[str]:
        fds = [group.fds(index) for group in self.groups]
        return [
            sys.executable, "-m", "leveret.worker",
            "--index", str(index), "--count", str(self.count),
            "--control-fd", str(self._child_ends[index].fileno()),
            "--listen-fds", json.dumps(fds),
            "--mqtt-fds", json.dumps(self.mqtt_group.fds(index) if self.mqtt_group else []),
            "--log-level", self.log_level,
        ]  # fmt: skip

    def pass_fds(self, index: int) -> list[int]:
        fds = [self._child_ends[index].fileno()]
        for group in self.groups:
            fds.extend(group.fds(index))
        if self.mqtt_group is not None:
            fds.extend(self.mqtt_group.fds(index))
        return fds

    def on_start(self, index: int) -> None:
        """Before worker `index` starts: its control channel, and a link to each
        other worker that runs (its end sent to that worker now, ours queued on the
        new channel, read by the worker once its stored messages are back)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.controls[index] = ours
        self._child_ends[index] = theirs
        for peer in sorted(self.members):
            # The mesh's link, then the handoff channel (workers/affinity.py): a pair
            # of its own, so a connection's descriptor never waits behind messages.
            self._next_pair += 1
            pair = self.pairs[frozenset((index, peer))] = self._next_pair
            for kind in ("link", "handoff"):
                a, b = mesh_pair()
                try:
                    try:
                        send_link(self.controls[peer], index, a, kind, pair)
                    except OSError as exc:  # that worker is exiting; its restart links again
                        log.info("no new %s for worker %d: %s", kind, peer, exc)
                        break
                    send_link(ours, peer, b, kind, pair)
                finally:
                    a.close()
                    b.close()
        self.members.add(index)
        reader = EventReader(lambda event: self._event(index, event))
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable, index, ours, reader)

    def on_spawned(self, index: int) -> None:
        end = self._child_ends.pop(index, None)
        if end is not None:
            end.close()  # the worker has its own copy (or never started)

    def on_exit(self, index: int, status: int | None) -> None:
        self.members.discard(index)
        self.links.pop(index, None)
        self.told.discard(index)
        ours = self.controls.pop(index, None)
        if ours is not None:
            asyncio.get_running_loop().remove_reader(ours.fileno())
            ours.close()

    def _readable(self, index: int, sock: socket.socket, reader: EventReader) -> None:
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the worker exited (its exit status comes from wait())
            asyncio.get_running_loop().remove_reader(sock.fileno())
            return
        try:
            reader.feed(data)
        except ValueError as exc:
            log.error("worker %d sent a bad event: %s", index, exc)

    def _ping(self, index: int, seq: int) -> None:
        """Liveness ping `seq` to worker `index` (answered by a "pong" event)."""
        channel = self.controls.get(index)
        if channel is not None:
            send_ping(channel, seq)

    def _event(self, index: int, event: dict) -> None:
        sup = self.supervisor
        assert sup is not None
        pong = event.get("pong")
        if isinstance(pong, int) and not isinstance(pong, bool):
            links = event.get("links")
            store = event.get("store")
            sup.alive(
                index,
                pong,
                {int(p): float(w) for p, w in links.items()} if isinstance(links, dict) else None,
                float(store) if isinstance(store, (int, float)) else 0.0,
            )
            return
        if "sync_failed" in event:
            reason = f"worker {index} cannot sync with worker 0: {event['sync_failed']}"
            if event.get("permanent"):
                sup.fail(index, reason)  # every start would fail alike
            else:
                log.warning("%s; it exits to be restarted", reason)
            return
        if "started" in event:
            sup.started(index)
        if "linked" in event:
            self.links[index] = event
            self._serve_when_linked()
        if "ready" not in event:
            return
        sup.ready(index)
        if self.announced:
            log.info("worker %d serves again", index)
            return
        if all(w.ready for w in sup.workers):
            self.announced = True
            for group in self.groups:
                log.info(
                    "Leveret listening for AMQP 0-9-1%s on %s",
                    " over TLS" if group.kind == "amqps" else "",
                    Listener(group.host, group.port, group.kind),
                )
            log.info("Leveret started with %d workers", self.count)

    def _linked(self, index: int) -> bool:
        """Whether worker `index` runs the live link to every other worker that runs
        (or starts) and is in sync: it follows worker 0's metadata, or, worker 0,
        every worker it is linked to took its snapshot."""
        report = self.links.get(index)
        if report is None or index not in self.members:
            return False
        if not report.get("synced"):
            return False
        have = report.get("linked") or {}
        return all(
            have.get(str(peer)) == self.pairs.get(frozenset((index, peer)))
            for peer in self.members
            if peer != index
        )

    def _serve_when_linked(self) -> None:
        """Tell workers to accept clients. At the broker's start, all of them at once,
        once every worker is up, linked to every other and in sync: until then a
        client could find a queue of a worker not linked yet "down". Later (a worker
        restarted while the others serve) each one once it is linked and in sync."""
        if not self.serving:
            if len(self.members) < self.count or not all(
                self._linked(i) for i in range(self.count)
            ):
                return
            self.serving = True
            log.info("every worker is linked to every other and in sync: serving")
            waiting = range(self.count)
        else:
            waiting = [i for i in sorted(self.members) if i not in self.told and self._linked(i)]
        for index in waiting:
            if index in self.told:
                continue
            channel = self.controls.get(index)
            if channel is None:
                continue
            try:
                send_serve(channel)
            except OSError as exc:  # it is exiting: its restart is told again
                log.info("cannot tell worker %d to serve: %s", index, exc)
                continue
            self.told.add(index)

    def close(self) -> None:
        for group in self.groups:
            group.close()
        self.groups = []
        if self.mqtt_group is not None:
            self.mqtt_group.close()
            self.mqtt_group = None
        for sock in [*self.controls.values(), *self._child_ends.values()]:
            sock.close()
        self.controls.clear()
        self._child_ends.clear()


async def serve(config: ServerConfig, log_level: str = "info") -> int:
    """Run the broker of `config.workers` workers until SIGTERM or SIGINT."""
    return await Workers(config, log_level).run()
