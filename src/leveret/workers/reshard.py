"""`leveret reshard`: change a data dir's worker count, offline.

A broker of N workers keeps each queue in the store of the worker that owns it
(`<data-dir>/worker-<i>`), and a one-process broker keeps its store in the data
dir itself; `workers.json` pins the count. Another count needs every queue in the
store of its new owner. This module rebuilds the stores for the new count from
the old ones while no broker runs, through the stores' own APIs:

- definitions: worker 0's `definitions.db` (every worker holds all metadata) is
  copied into each new store with SQLite's backup API, and each queue's `worker`
  column set to its new owner (NULL in the owner's own store);
- messages: every queue's stored messages are read back in order from the old
  owner's message store and written into the new owner's, with their redelivered
  flag and (quorum queues) delivery count; a priority queue level by level;
- delayed exchanges' pending messages (each worker keeps those its clients
  published) go from old worker i to new worker i mod N, due times kept;
- streams: the segment files are copied as they are. A stream's log is
  self-contained (each record carries its offset, `store/stream_log.py`) and
  refers to nothing of the message store, so a copy keeps every offset;
- exchanges' own state files (`exchanges/`) go to new worker j from old worker j
  (old worker 0 where there is none);
- MQTT retained messages (`mqtt-retained.sqlite`, held by worker 0, or by the one
  process) go from old worker 0 to new worker 0, with SQLite's backup API.

Crash safety. The new stores are written under `reshard.new/` and fsynced while
the old ones stay untouched in place, so a crash leaves a data dir that the old
count opens (the leftover `reshard.new/` is removed at the next start). Then one
atomic rename writes `reshard.json`, the manifest: from that moment the change is
decided and is rolled forward (`finish_pending`), by this command or by the next
`leveret server` start, whichever runs first: the old stores move to
`reshard.old/`, the new ones into place, `workers.json` gets the new count (or
goes, for one process), and the manifest is removed; each step can run again
after a crash. A data dir therefore opens under the old count until the manifest
exists and under the new count after, never with a queue in two stores or in
none.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import sqlite3
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

from leveret.mqtt.retained import FILE_NAME as RETAINED_FILE
from leveret.store.catalog import CatalogStore
from leveret.store.definitions import DefinitionStore
from leveret.store.delay_queue import is_delay_key
from leveret.store.errors import StoreError
from leveret.store.files import fsync_dir, write_atomic
from leveret.store.message_store import MessageStore
from leveret.workers.mesh import placement
from leveret.workers.serve import LAYOUT_FILE, STATUS_FILE, WorkersError, read_layout

log = logging.getLogger("leveret.workers")

MANIFEST = "reshard.json"
STAGING = "reshard.new"
OLD = "reshard.old"
LOCK = "reshard.lock"
#: a one-process broker's store in its data dir (what moves when it becomes workers)
TOP_STORE = (
    "definitions.db",
    "definitions.db-wal",
    "definitions.db-shm",
    "msgs",
    "streams",
    "exchanges",
    RETAINED_FILE,
    f"{RETAINED_FILE}-wal",
    f"{RETAINED_FILE}-shm",
)
#: the name of a one-process store's place in the staging dir
TOP = "top"
#: messages read and written per batch
BATCH = 1024

#: told the name of each step as it is done (tests kill the process at one)
Step = Callable[[str], None]


@dataclass
class Report:
    """What a re-shard did."""

    old: int  # 0: a one-process data dir
    new: int
    queues: int = 0
    messages: int = 0
    delayed: int = 0
    streams: int = 0
    retained: int = 0
    moved: list[str] = field(default_factory=list)  # "vhost/name: 0 -> 2"

    def summary(self) -> str:
        old = "one process" if self.old == 0 else f"{self.old} workers"
        new = "one process" if self.new == 1 else f"{self.new} workers"
        return (
            f"re-sharded from {old} to {new}: {self.queues} durable queues "
            f"({len(self.moved)} changed owner), {self.messages} messages, "
            f"{self.delayed} delayed messages, {self.streams} streams, "
            f"{self.retained} MQTT retained messages"
        )


def _worker_dir(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, f"worker-{index}")


def old_layout(data_dir: str) -> int | None:
    """The data dir's count: N for a broker of N workers, 0 for a one-process store,
    None for a data dir that holds no store."""
    doc = read_layout(data_dir)
    if doc is not None:
        count = doc.get("workers") if isinstance(doc, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise WorkersError(f"{os.path.join(data_dir, LAYOUT_FILE)} names no worker count")
        return count
    if os.path.exists(os.path.join(data_dir, "definitions.db")):
        return 0
    return None


def _sources(data_dir: str, old: int) -> list[str]:
    return [data_dir] if old == 0 else [_worker_dir(data_dir, i) for i in range(old)]


def _targets(staging: str, new: int) -> list[str]:
    return (
        [os.path.join(staging, TOP)]
        if new == 1
        else [os.path.join(staging, f"worker-{j}") for j in range(new)]
    )


# --- the broker must not run ----------------------------------------------------------


def _running(data_dir: str) -> str | None:
    """What shows a broker running on this data dir (a ctl socket that answers, the
    live supervisor its status file names), or None."""
    supervisor = _live_supervisor(data_dir)
    if supervisor is not None:
        return supervisor
    paths = [os.path.join(data_dir, "ctl.sock")]
    with contextlib.suppress(OSError):
        paths += [
            os.path.join(data_dir, name, "ctl.sock")
            for name in sorted(os.listdir(data_dir))
            if name.startswith("worker-")
        ]
    for path in paths:
        if not os.path.exists(path):
            continue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return f"{path} answers"
        except OSError:
            continue
        finally:
            sock.close()
    return None


def _live_supervisor(data_dir: str) -> str | None:
    """The supervisor of a broker of workers, from its status file, while a `leveret`
    process runs with that pid (a file left by one that was killed names a dead or
    reused pid, which is told apart by its command line)."""
    path = os.path.join(data_dir, STATUS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            pid = json.load(f).get("pid")
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if int(pid) == os.getpid():
        return None
    return f"its supervisor, pid {pid} ({path})" if b"leveret" in cmdline else None


@contextlib.contextmanager
def _locked(data_dir: str) -> Iterator[None]:
    """One re-shard (or roll-forward) at a time on a data dir."""
    fd = os.open(os.path.join(data_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkersError(f"another re-shard of {data_dir} is running") from None
        yield
    finally:
        os.close(fd)


# --- the new stores ---------------------------------------------------------------------


def _owners(defs_path: str, old: int, new: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(vhost, name) -> (old owner, new owner) of every stored queue definition.

    Every stored queue is a named one, placed by its name: exclusive and
    server-named (amq.gen-*) queues are never stored (`ClassicQueue.stores_messages`,
    `vhost.stored_remote`), so nothing placed by its declaring connection moves."""
    store = DefinitionStore(defs_path)
    try:
        queues = store.load().queues
    finally:
        store.close()
    return {
        (q.vhost, q.name): (
            q.worker if (old > 1 and q.worker is not None) else 0,
            placement(q.vhost, q.name, new),
        )
        for q in queues
    }


def _stored_cluster_name(data_dir: str) -> str | None:
    """The name a one-process broker made on its first start and keeps in its catalog."""
    store = DefinitionStore(os.path.join(data_dir, "definitions.db"))
    try:
        record = (CatalogStore(store.db).load() or {}).get("cluster", {}).get("name")
    finally:
        store.close()
    return record.get("name") if isinstance(record, dict) else None


def _copy_definitions(
    source: str, target: str, owners: dict, index: int, new: int, cluster_name: str
) -> None:
    """Worker 0's definitions (catalog included) into a new store, each queue's owner
    set for the store of new worker `index`. A one-process store keeps the broker's
    name in its catalog (a broker of workers, in `workers.json`)."""
    os.makedirs(target, exist_ok=True)
    src = sqlite3.connect(os.path.join(source, "definitions.db"))
    dst = sqlite3.connect(os.path.join(target, "definitions.db"))
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    store = DefinitionStore(os.path.join(target, "definitions.db"))
    try:
        for (vhost, name), (_was, now) in owners.items():
            store.set_queue_worker(vhost, name, None if new == 1 or now == index else now)
        if new == 1:
            CatalogStore(store.db).put("cluster", "name", {"name": cluster_name})
    finally:
        store.close()


def _copy_retained(source: str, target: str) -> int:
    """The MQTT retained messages of old worker 0 (or the one process) into new
    worker 0's store dir, WAL included; how many there are."""
    path = os.path.join(source, RETAINED_FILE)
    if not os.path.exists(path):
        return 0
    src = sqlite3.connect(path)
    dst = sqlite3.connect(os.path.join(target, RETAINED_FILE))
    try:
        src.backup(dst)
        return dst.execute("SELECT count(*) FROM retained").fetchone()[0]
    finally:
        dst.close()
        src.close()


def _copy_tree(source: str, target: str) -> None:
    if os.path.isdir(source):
        shutil.copytree(source, target, dirs_exist_ok=True)


def _fsync_tree(top: str) -> None:
    """Every file and directory under `top`, and `top` itself, on disk."""
    for directory, _dirs, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(directory)


def _open(directory: str) -> tuple[MessageStore, dict]:
    store = MessageStore(directory, fsync="batch")
    return store, store.open_paged()


def _build(
    data_dir: str, old: int, new: int, cluster_name: str, report: Report, step: Step
) -> None:
    """Write the stores of the new count into the staging dir, fsynced."""
    staging = os.path.join(data_dir, STAGING)
    sources = _sources(data_dir, old)
    targets = _targets(staging, new)
    owners = _owners(os.path.join(sources[0], "definitions.db"), old, new)
    report.queues = len(owners)
    report.moved = sorted(f"{v}/{n}: {w} -> {o}" for (v, n), (w, o) in owners.items() if w != o)
    for j, target in enumerate(targets):
        _copy_definitions(sources[0], target, owners, j, new, cluster_name)
        _copy_tree(
            os.path.join(sources[j] if j < len(sources) else sources[0], "exchanges"),
            os.path.join(target, "exchanges"),
        )
    report.retained = _copy_retained(sources[0], targets[0])
    step("definitions")
    opened = [_open(t) for t in targets]
    writers = [store for store, _ in opened]
    try:
        for i, source in enumerate(sources):
            _copy_store(source, i, writers, owners, new, report, step)
            _copy_streams(source, i, targets, owners, new, report)
            step(f"source-{i}")
        for store in writers:
            store.flush()
    finally:
        for store in writers:
            store.close()
    _fsync_tree(staging)
    fsync_dir(data_dir)
    step("staged")


def _owner(owners: dict, vhost: str, name: str, new: int) -> int:
    known = owners.get((vhost, name))
    return known[1] if known is not None else placement(vhost, name, new)


def _copy_store(
    source: str,
    index: int,
    writers: list[MessageStore],
    owners: dict,
    new: int,
    report: Report,
    step: Step,
) -> None:
    """One old store's messages into the new owners' stores. The old store is only
    read (its clean-shutdown index, taken when it opens, is written back on close)."""
    if not os.path.isdir(os.path.join(source, "msgs")):
        return
    reader, stored = _open(source)
    try:
        for key in sorted(stored, key=repr):
            tail = stored[key]
            if is_delay_key(key):
                target = writers[index % new]
                delays = target.delays.index(key[0], key[1])
                for due, blob, body, transient in reader.delays.read_all(tail):
                    target.delays.add(delays, due, blob, body, None, transient)
                    report.delayed += 1
                continue
            target = writers[_owner(owners, key[0], key[1], new)]
            while tail.n:
                for loc, blob, body in reader.take_paged(tail, BATCH):
                    if loc.transient:
                        continue  # a body paged out of RAM: recovery drops it too
                    copy = target.publish(key, blob, body)
                    if loc.redelivered:
                        count = reader.delivery_count(loc)
                        if count > 1:
                            target.note_count(copy, count)
                        else:
                            target.mark_delivered(copy)
                    report.messages += 1
            step(f"queue-{index}-{key[0]}-{key[1]}")
    finally:
        reader.close()


def _copy_streams(
    source: str, index: int, targets: list[str], owners: dict, new: int, report: Report
) -> None:
    """Old store `index`'s streams, as files, into their new owners' stores: only
    those it owned (a directory elsewhere would not be the stream's log)."""
    top = os.path.join(source, "streams")
    if not os.path.isdir(top):
        return
    for vhost_q in sorted(os.listdir(top)):
        vhost_dir = os.path.join(top, vhost_q)
        for name_q in sorted(os.listdir(vhost_dir)):
            known = owners.get((unquote(vhost_q), unquote(name_q)))
            if known is not None and known[0] != index:
                continue
            owner = _owner(owners, unquote(vhost_q), unquote(name_q), new)
            shutil.copytree(
                os.path.join(vhost_dir, name_q),
                os.path.join(targets[owner], "streams", vhost_q, name_q),
            )
            report.streams += 1


# --- the switch and the roll-forward ----------------------------------------------------


def _write_manifest(data_dir: str, doc: dict) -> None:
    write_atomic(os.path.join(data_dir, MANIFEST), json.dumps(doc).encode())


def _rename(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)


def finish_pending(data_dir: str, step: Step | None = None) -> bool:
    """Complete a re-shard whose manifest was written, or drop the staging dir of one
    that stopped before; True if one was completed. Safe to run again at any point
    (each step checks what is done). The server runs this before it opens the data
    dir."""
    step = step or (lambda _name: None)
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.exists(path):
        for leftover in (STAGING, OLD):
            where = os.path.join(data_dir, leftover)
            if os.path.exists(where):
                shutil.rmtree(where)
                fsync_dir(data_dir)
        return False
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        old, new, phase = doc["old"], doc["new"], doc["phase"]
    except (OSError, ValueError, KeyError) as exc:
        raise WorkersError(f"{path} cannot be read: {exc}") from None
    staging, retired = os.path.join(data_dir, STAGING), os.path.join(data_dir, OLD)
    if phase == "switch":
        os.makedirs(retired, exist_ok=True)
        names = TOP_STORE if old == 0 else [f"worker-{i}" for i in range(old)]
        for name in names:
            if os.path.exists(os.path.join(data_dir, name)):
                _rename(os.path.join(data_dir, name), os.path.join(retired, name))
                step(f"retired-{name}")
        fsync_dir(retired)
        fsync_dir(data_dir)
        doc["phase"] = phase = "retired"
        _write_manifest(data_dir, doc)
        step("retired")
    if phase == "retired":
        if new == 1:
            moves = [(os.path.join(staging, TOP, n), os.path.join(data_dir, n)) for n in TOP_STORE]
        else:
            moves = [
                (os.path.join(staging, f"worker-{j}"), _worker_dir(data_dir, j)) for j in range(new)
            ]
        for source, target in moves:
            if os.path.exists(source):
                _rename(source, target)
                step(f"placed-{os.path.basename(target)}")
        fsync_dir(data_dir)
        layout = os.path.join(data_dir, LAYOUT_FILE)
        if new == 1:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layout)
        else:
            write_atomic(
                layout, json.dumps({"workers": new, "cluster_name": doc["cluster_name"]}).encode()
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(data_dir, STATUS_FILE))
        fsync_dir(data_dir)
        step("layout")
        os.unlink(path)
        fsync_dir(data_dir)
        step("done")
    for leftover in (staging, retired):
        shutil.rmtree(leftover, ignore_errors=True)
    fsync_dir(data_dir)
    log.info(
        "re-shard of %s to %s completed", data_dir, "one process" if new == 1 else f"{new} workers"
    )
    return True


def complete(data_dir: str) -> bool:
    """At a broker's start, before the data dir is read: roll a decided re-shard
    forward, or drop what one that stopped before its switch left. Does nothing (and
    creates nothing) on a data dir without either. WorkersError while a re-shard runs."""
    if not any(os.path.exists(os.path.join(data_dir, n)) for n in (MANIFEST, STAGING, OLD)):
        return False
    with _locked(data_dir):
        return finish_pending(data_dir)


def reshard(data_dir: str, new: int, step: Step | None = None) -> Report | None:
    """Change the data dir's worker count to `new` (1: one process). None if it
    already has that count or holds no store; WorkersError when it cannot."""
    step = step or (lambda _name: None)
    if new < 1:
        raise WorkersError(f"--workers must be at least 1, got {new}")
    if not os.path.isdir(data_dir):
        raise WorkersError(f"the data dir {data_dir} does not exist")
    if os.path.exists(os.path.join(data_dir, "cluster-node.json")):
        raise WorkersError(
            f"the data dir {data_dir} is a cluster node's; every node of a cluster runs the "
            "same count, so a cluster's count is not changed node by node"
        )
    running = _running(data_dir)
    if running is not None:
        raise WorkersError(f"a broker runs on the data dir {data_dir} ({running}); stop it first")
    with _locked(data_dir):
        finish_pending(data_dir)
        old = old_layout(data_dir)
        if old is None or (old == 0 and new == 1) or old == new:
            return None
        for i in range(old):
            if not os.path.isdir(_worker_dir(data_dir, i)):
                raise WorkersError(
                    f"the data dir {data_dir} lacks worker-{i}/ of its {old} workers"
                )
        # The broker's name goes with it (federation tells brokers apart by it).
        layout = read_layout(data_dir) or {}
        cluster_name = (
            _stored_cluster_name(data_dir) if old == 0 else layout.get("cluster_name")
        ) or f"leveret-{os.urandom(3).hex()}@{socket.gethostname()}"
        report = Report(old, new)
        _build(data_dir, old, new, cluster_name, report, step)
        # The switch: from here on the new count is the data dir's.
        _write_manifest(
            data_dir, {"old": old, "new": new, "phase": "switch", "cluster_name": cluster_name}
        )
        step("manifest")
        finish_pending(data_dir, step)
        return report


def main(data_dir: str, count: int) -> int:
    """`leveret reshard --data-dir D --workers N`."""
    try:
        report = reshard(data_dir, count)
    except (WorkersError, StoreError, OSError, sqlite3.Error) as exc:
        print(f"leveret reshard: {exc}", file=sys.stderr)
        return 1
    if report is None:
        old = old_layout(data_dir)
        what = (
            "holds no store"
            if old is None
            else ("is a one-process data dir" if old == 0 else f"has {old} workers")
        )
        print(f"leveret reshard: nothing to do: the data dir {data_dir} {what}")
        return 0
    print(f"leveret reshard: {report.summary()}")
    return 0
