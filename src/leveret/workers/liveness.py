"""Finding a worker that hangs without exiting: the supervisor's pings (sans-IO).

A worker whose event loop is stuck (a loop that never yields, a deadlock, a
SIGSTOP) keeps its process and its links, so nothing sees it go, while its clients
and the other workers' calls to its queues wait. The supervisor pings each worker
that said it serves over its control channel; the worker answers from its event
loop, so a stuck loop does not. A worker that answered nothing for `timeout`
seconds is hung: the supervisor logs it and SIGKILLs it, and its usual restart
follows.

Like a systemd watchdog or Erlang's net tick, the rule is silence for a whole
timeout, never one late answer, and the default is generous (`DEFAULT_TIMEOUT`): a
worker in a long fsync or a big synchronous step on a loaded machine must not be
killed. A worker is watched only once it said it is ready: until then it reads its
store back, which can take as long as the store is large, and it does not answer
yet. If the supervisor's own loop did not run for a while (the machine was
overloaded, the supervisor stopped), it could not have read the answers that came
meanwhile, so every clock starts again rather than count that time as silence.

A loop that runs can still leave a part stuck. Each answer carries the parts that
matter beyond the control channel, as the worker measures them:

- its links to the other workers: the worker makes a round trip (a `probe` call)
  over each link at each ping, and reports how long its oldest unanswered one has
  waited (`Probes`). A link whose reader or writer is stuck at either end answers
  none. A probe counts only from the moment the peer's process said it is up
  (before, it reads its store back and reads no link) to the peer's last answer (a
  peer whose loop stopped is the loop rule's). A link that answered none for the
  timeout while both loops ran is stuck: one of its two workers is killed (the
  higher index: worker 0 writes metadata and serves management and MQTT), and its
  restart makes a new link.
- its store's writer: how long the writer thread has been on its current batch of
  writes and fsync. Beyond the timeout that is logged (and logged again when it
  moves on), never killed: a process in a disk wait is not even stopped by SIGKILL
  until the disk answers, a restart would wait on the same disk, and a slow disk
  must not have workers killed in a loop. Its publishers wait for their confirms as
  on one process.

`Liveness` holds the clocks; the caller sends the pings and kills (serve.py,
supervisor.py). Times are `time.monotonic()` seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: seconds a ready worker may answer no ping before it is killed
DEFAULT_TIMEOUT = 30.0
#: pings sent within one timeout
PINGS_PER_TIMEOUT = 6


@dataclass
class Watch:
    """One worker process being watched: since when it has been silent, what was sent."""

    heard: float  # when it last answered (or became ready)
    next_ping: float
    sent: int = 0  # the last ping's number
    hung: bool = False  # reported once; the caller kills it
    since: float = 0.0  # when this process said it is up
    #: peer -> seconds its oldest unanswered link probe had waited, at the last answer
    links: dict[int, float] = field(default_factory=dict)
    store: float = 0.0  # seconds its store's writer had been on one batch, at the last answer
    store_stuck: bool = False  # reported; reported again when it moves on


class Liveness:
    """The clocks of the workers being watched, by index."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, interval: float | None = None) -> None:
        if not timeout > 0:
            raise ValueError(f"a liveness timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.interval = interval if interval is not None else timeout / PINGS_PER_TIMEOUT
        self.watches: dict[int, Watch] = {}
        self._last_tick: float | None = None

    def ready(self, index: int, now: float) -> None:
        """Worker `index` (a new process of it) said it serves: watch it from now,
        pinging it at once."""
        self.watches[index] = Watch(heard=now, next_ping=now, since=now)

    def gone(self, index: int) -> None:
        """Worker `index` exited (or is not to be watched): forget its clock."""
        self.watches.pop(index, None)

    def answered(
        self,
        index: int,
        seq: int,
        now: float,
        links: dict[int, float] | None = None,
        store: float = 0.0,
    ) -> None:
        """Worker `index` answered ping `seq`: its loop ran at `now`; `links` and
        `store` are the waits it reported (see the module)."""
        watch = self.watches.get(index)
        if watch is not None and 0 < seq <= watch.sent:
            if now >= watch.heard:
                watch.links = dict(links or {})
                watch.store = store
            watch.heard = max(watch.heard, now)

    def stuck_parts(
        self,
    ) -> tuple[list[tuple[int, int, float]], list[tuple[int, float, bool]]]:
        """The parts found stuck since the last call, from the workers' last answers:
        links, (the worker to kill, the other end, seconds), one per pair of workers;
        store writers newly stuck or moving again, (index, seconds, stuck)."""
        kills: list[tuple[int, int, float]] = []
        stores: list[tuple[int, float, bool]] = []
        for index, watch in self.watches.items():
            if watch.hung:
                continue
            for peer, waited in watch.links.items():
                other = self.watches.get(peer)
                if other is None or other.hung:
                    continue  # not up yet (it links once up), or being killed
                # Counted while the probe was out and the peer's loop ran: from its
                # sending (or the peer's start: it links once up) to the peer's last
                # answer. A peer whose loop stopped is the loop rule's (`tick`).
                sent = watch.heard - waited
                waited = min(watch.heard, other.heard) - max(sent, other.since)
                if waited > self.timeout:
                    victim = max(index, peer)
                    self.watches[victim].hung = True
                    kills.append((victim, min(index, peer), waited))
                    break
            if watch.hung:
                continue
            if watch.store > self.timeout and not watch.store_stuck:
                watch.store_stuck = True
                stores.append((index, watch.store, True))
            elif watch.store_stuck and watch.store <= self.timeout:
                watch.store_stuck = False
                stores.append((index, watch.store, False))
        return kills, stores

    def tick(self, now: float) -> tuple[list[tuple[int, int]], list[tuple[int, float]]]:
        """What to do at `now`: the pings to send, (index, number), and the workers
        newly found hung, (index, seconds silent). Call it every `interval` or so."""
        last, self._last_tick = self._last_tick, now
        if last is not None and now - last > 2 * self.interval:
            # This process did not run: the answers of that time are unread.
            for watch in self.watches.values():
                watch.heard = max(watch.heard, now)
                watch.next_ping = min(watch.next_ping, now)
        pings: list[tuple[int, int]] = []
        hung: list[tuple[int, float]] = []
        for index, watch in self.watches.items():
            if watch.hung:
                continue
            silent = now - watch.heard
            if silent > self.timeout:
                watch.hung = True
                hung.append((index, silent))
                continue
            if now >= watch.next_ping:
                watch.sent += 1
                watch.next_ping = now + self.interval
                pings.append((index, watch.sent))
        return pings, hung


class Probes:
    """A worker's round trips over its links: at most one out per link, and how long
    the oldest unanswered one has waited (sans-IO: the worker sends them, a `probe`
    call its peer answers from its reader)."""

    def __init__(self) -> None:
        self.out: dict[int, tuple[object, float]] = {}  # peer -> (token, sent at)

    def due(self, peers: Iterable[int]) -> list[int]:
        """The peers of `peers` to probe now: those with none out."""
        return [peer for peer in peers if peer not in self.out]

    def sent(self, peer: int, token: object, now: float) -> None:
        self.out[peer] = (token, now)

    def done(self, peer: int, token: object) -> None:
        """Probe `token` to `peer` came back (or failed: its link went)."""
        entry = self.out.get(peer)
        if entry is not None and entry[0] is token:
            del self.out[peer]

    def waits(self, now: float) -> dict[int, float]:
        """peer -> seconds its probe has waited, for each probe out."""
        return {peer: now - at for peer, (_token, at) in self.out.items()}
