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

`Liveness` holds the clocks; the caller sends the pings and kills (serve.py,
supervisor.py). Times are `time.monotonic()` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        self.watches[index] = Watch(heard=now, next_ping=now)

    def gone(self, index: int) -> None:
        """Worker `index` exited (or is not to be watched): forget its clock."""
        self.watches.pop(index, None)

    def answered(self, index: int, seq: int, now: float) -> None:
        """Worker `index` answered ping `seq`: its loop ran at `now`."""
        watch = self.watches.get(index)
        if watch is not None and 0 < seq <= watch.sent:
            watch.heard = max(watch.heard, now)

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
