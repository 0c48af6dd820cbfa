"""The control channel between the supervisor and one worker process.

An AF_UNIX stream socket pair, made by the supervisor at each start of the worker;
the worker gets its end as a passed descriptor. Each direction has its own use:

- supervisor -> worker, in the handoff framing (`handoff.py`):
  - the worker's end of a mesh socket pair, with the index of the peer at the
    other end and the pair's number (`handoff.send_connection`, the descriptor by
    SCM_RIGHTS, the state `{"peer": N, "kind": "link", "pair": P}` as JSON). Every
    link reaches a worker this way, the first ones and those made when a peer
    restarts, so a worker has one path for both: `mesh.connect(peer, sock)` (which
    replaces a link to that peer). The handoff channel with each peer (`"kind":
    "handoff"`, the pair client connections move on to the worker of their queues)
    comes the same way.
  - notes (`handoff.send_note`, no descriptor): liveness pings, `{"ping": N}`,
    which the worker answers from its event loop (`liveness.py`), `{"serve":
    true}`: accept clients now (`send_serve`), and, to worker 0 of a leading cluster
    node, `{"cluster": {...}}`: the cluster as the node sees it, which worker 0's
    management API and Prometheus show (`send_cluster`, cluster/view.py).
- worker -> supervisor: events, one JSON object per line:
  - `{"started": true}` once its store is open and its stored messages are back
    (it accepts no client yet);
  - `{"linked": {"J": P, ...}, "synced": bool}` each time its links (peer J over
    pair P) or its sync with worker 0 change, until it serves: the supervisor tells
    it to serve once it is linked to every other worker and in sync;
  - `{"ready": [[host, port], ...]}` once it accepts (the addresses it accepts on);
  - `{"pong": N}` for each ping.

The channel also tells each side that the other is gone: the supervisor sees the
worker's end close when it exits, and a worker whose supervisor died reads the end
of its channel and stops, instead of serving on as an orphan nobody restarts.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from leveret.workers.handoff import send_connection, send_note

#: an event line longer than this is not the worker's (it sends a few addresses)
MAX_LINE = 1 << 20


def send_link(
    channel: socket.socket, peer: int, sock: socket.socket, kind: str = "link", pair: int = 0
) -> None:
    """Give the worker at the other end of `channel` its end `sock` of the link to
    worker `peer` (the caller then closes its copy of `sock`). `kind` is "link" (the
    mesh's) or "handoff" (the pair client connections move on, workers/affinity.py);
    `pair` numbers the pair, so that the worker's reports name the link they mean."""
    state = {"peer": peer, "kind": kind, "pair": pair}
    send_connection(channel, sock, json.dumps(state).encode())


def link_pair(state: bytes) -> int:
    """The number the supervisor gave a link's socket pair (0 when it gave none)."""
    doc = json.loads(state)
    pair = doc.get("pair", 0) if isinstance(doc, dict) else 0
    if not isinstance(pair, int) or isinstance(pair, bool):
        raise ValueError(f"a link handoff with a bad pair number: {state!r}")
    return pair


def link_kind(state: bytes) -> str:
    """What a link handoff's socket is for: "link" or "handoff"."""
    doc = json.loads(state)
    kind = doc.get("kind", "link") if isinstance(doc, dict) else "link"
    if kind not in ("link", "handoff"):
        raise ValueError(f"a link handoff of unknown kind: {state!r}")
    return kind


def link_peer(state: bytes) -> int:
    """The peer index a link handoff's state names (ValueError if it names none)."""
    doc = json.loads(state)
    peer = doc.get("peer") if isinstance(doc, dict) else None
    if not isinstance(peer, int) or isinstance(peer, bool):
        raise ValueError(f"a link handoff without a peer: {state!r}")
    return peer


def send_ping(channel: socket.socket, seq: int) -> bool:
    """Liveness ping `seq` to the worker at the other end of `channel`, without
    waiting: False when its buffer is full (a worker that does not read is found
    by the pings it does not answer)."""
    return send_note(channel, json.dumps({"ping": seq}).encode())


def send_serve(channel: socket.socket) -> None:
    """Tell the worker at the other end of `channel` to accept clients (OSError when
    it cannot be told: the worker is exiting)."""
    if not send_note(channel, json.dumps({"serve": True}).encode()):
        raise BlockingIOError("the worker's control channel is full")


def send_cluster(channel: socket.socket, view: dict[str, Any]) -> bool:
    """The cluster's snapshot (cluster/view.py) to worker 0, without waiting: False
    when its buffer is full (the caller sends it again later)."""
    return send_note(channel, json.dumps({"cluster": view}).encode())


def cluster_view(note: bytes) -> dict[str, Any] | None:
    """The cluster snapshot a note carries, or None when it carries none."""
    doc = json.loads(note)
    if not isinstance(doc, dict) or "cluster" not in doc:
        return None
    view = doc["cluster"]
    if not isinstance(view, dict):
        raise ValueError(f"a cluster note that is not an object: {note[:200]!r}")
    return view


def is_serve(note: bytes) -> bool:
    """Whether a note is the supervisor's `serve`."""
    doc = json.loads(note)
    return isinstance(doc, dict) and doc.get("serve") is True


def ping_seq(note: bytes) -> int:
    """The number a liveness ping note carries (ValueError if it is not one)."""
    doc = json.loads(note)
    seq = doc.get("ping") if isinstance(doc, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ValueError(f"a note that is not a ping: {note!r}")
    return seq


def event_line(**event: Any) -> bytes:
    return json.dumps(event).encode() + b"\n"


class EventReader:
    """Sans-IO: the worker's bytes in, its events (dicts) out, in order."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self._buffer = bytearray()
        self._on_event = on_event

    def feed(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        while True:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > MAX_LINE:
                    raise ValueError("a worker event line over 1 MB")
                return
            line = bytes(buf[:end])
            del buf[: end + 1]
            if not line.strip():
                continue
            event = json.loads(line)
            if isinstance(event, dict):
                self._on_event(event)
