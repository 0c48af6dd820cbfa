"""Worker processes under one supervisor: start N, restart one that dies, stop all.

The broker split into workers is one broker to its users: a worker that crashes is
restarted (its queues are unreachable meanwhile), and a stop of the supervisor stops
every worker the way `leveret server` stops (each closes its connections with
320 CONNECTION_FORCED on SIGTERM, which is the worker's part). What this module does:

- start worker `i` as its own process, `command(i)` (a fresh interpreter: a worker
  does not inherit the supervisor's event loop or threads), with
  `LEVERET_WORKER_INDEX=i` in its environment;
- restart a worker that exits while the supervisor runs, after a backoff that
  doubles with each quick death (`backoff` up to `max_backoff`; a worker that ran
  `stable_after` seconds starts again from `backoff`);
- give up when more than `max_restarts` restarts, of all workers together, fall
  within `restart_window` seconds, as an Erlang supervisor's restart intensity does:
  a worker that cannot stay up is a broken broker, and looping hides it. It then
  stops the others and `run()` returns 1;
- on `stop()` (SIGTERM or SIGINT from `main`), send SIGTERM to every worker, wait
  `stop_timeout` seconds for them, SIGKILL what is left; `run()` returns 0;
- keep each worker's pid, state, restarts and last exit status (`status()`), and
  write them as JSON to `status_file` at every change, for operators and tests;
- give worker `i` the descriptors `pass_fds(i)`, which the supervisor keeps open: a
  listening socket of an `SO_REUSEPORT` group made here outlives the worker that
  accepts on it, so connections that reach it while that worker is down wait in its
  queue for the next one instead of being reset;
- tell its owner about each worker's life (`on_start(i)` just before a start, to
  make what the new process gets; `on_spawned(i)` once it runs, or failed to;
  `on_exit(i, status)`; `worker_env(i)`, more environment for it), and, with
  `require_ready`, treat a worker that exits before it ever said it was up
  (`started(i)`, or `ready(i)`: it serves) as a broker that cannot start: the
  others are stopped and `run()` returns that worker's exit status (1 if it had
  none);
- with `liveness_timeout` (seconds, 0 = off) and `ping(i, n)` (send ping `n` to
  worker `i`; its answer comes back as `alive(i, n)`), find a worker that hangs
  without exiting: each worker that said it is up is pinged (one that waits to
  serve too: a hang there would keep the broker from serving), and one that answers
  nothing for the timeout is logged and SIGKILLed, then restarted as any worker that
  dies (`liveness.py` has the rule and why). Its answers (`alive(i, n, links,
  store)`) also report its link round trips and its store's writer: a link stuck
  while both loops run gets one of its workers killed the same way; a stuck store
  writer is logged and noted (`store_stuck`), never killed;
- on `fail(i, reason)` (a worker met an error no restart can mend: worker 0
  refused its sync), stop every worker; `run()` returns 1.

`python -m leveret.workers.supervisor --workers N -- COMMAND...` runs one, with
`{index}` in COMMAND replaced by each worker's index.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from leveret.workers.liveness import Liveness

log = logging.getLogger("leveret.workers")

Command = Callable[[int], Sequence[str]]


@dataclass
class WorkerStatus:
    """One worker as the supervisor knows it. `state`: starting, running, restarting
    (waiting for its backoff), stopped, failed (could not start, or given up).
    `last_exit` is the last exit status (negative: killed by that signal)."""

    index: int
    pid: int | None = None
    state: str = "starting"
    restarts: int = 0
    last_exit: int | None = None
    started_at: float | None = None
    ready: bool = False  # this start said it serves (Supervisor.ready)
    ever_ready: bool = False
    hangs: int = 0  # times it answered no ping for the liveness timeout and was killed
    ever_started: bool = False  # some start said it is up, serving or not (Supervisor.started)
    store_stuck: bool = False  # its store's writer is on one batch beyond the liveness timeout


class Supervisor:
    """Runs `count` workers made by `command` until `stop()` or too many restarts."""

    def __init__(
        self,
        count: int,
        command: Command,
        *,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        stable_after: float = 10.0,
        max_restarts: int = 10,
        restart_window: float = 60.0,
        stop_timeout: float = 10.0,
        status_file: str | None = None,
        env: dict[str, str] | None = None,
        pass_fds: Callable[[int], Sequence[int]] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_spawned: Callable[[int], None] | None = None,
        on_exit: Callable[[int, int | None], None] | None = None,
        worker_env: Callable[[int], dict[str, str]] | None = None,
        require_ready: bool = False,
        new_session: bool = False,
        liveness_timeout: float = 0.0,
        ping: Callable[[int, int], None] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("a supervisor needs at least one worker")
        self.count = count
        self.command = command
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.stop_timeout = stop_timeout
        self.status_file = status_file
        self.env = dict(os.environ if env is None else env)
        self.pass_fds = pass_fds
        self.on_start = on_start
        self.on_spawned = on_spawned
        self.on_exit = on_exit
        self.worker_env = worker_env
        self.require_ready = require_ready
        # Workers in their own session: a terminal's Ctrl-C (SIGINT to the foreground
        # process group) reaches the supervisor alone, which stops them in order.
        self.new_session = new_session
        self.workers = [WorkerStatus(i) for i in range(count)]
        # Pinging needs a channel to each worker: the owner's `ping`.
        self.liveness = (
            Liveness(liveness_timeout) if liveness_timeout > 0 and ping is not None else None
        )
        self.ping = ping
        self.state = "starting"  # running, stopping, stopped, failed
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._restarts: deque[float] = deque()  # monotonic times of recent restarts
        self._stopping = False
        self._stop: asyncio.Event | None = None
        self._failed: set[int] = set()  # workers that stopped the broker (`fail`)
        self.exit_code = 0

    def status(self) -> list[WorkerStatus]:
        """Each worker's pid and state, by index."""
        return list(self.workers)

    def started(self, index: int) -> None:
        """Worker `index` (its current process) is up, not serving yet: an exit now is
        a crash to restart from, not a start that cannot succeed (`require_ready`),
        and from now on it answers liveness pings."""
        worker = self.workers[index]
        if worker.state == "running" and not worker.ever_started:
            worker.ever_started = True
        if worker.state == "running" and self.liveness is not None:
            self.liveness.ready(index, time.monotonic())

    def ready(self, index: int) -> None:
        """Worker `index` (its current process) serves: noted in its status."""
        worker = self.workers[index]
        if worker.state == "running" and not worker.ready:
            worker.ready = worker.ever_ready = worker.ever_started = True
            if self.liveness is not None and index not in self.liveness.watches:
                self.liveness.ready(index, time.monotonic())
            self._write_status()

    def alive(
        self, index: int, seq: int, links: dict[int, float] | None = None, store: float = 0.0
    ) -> None:
        """Worker `index` (its current process) answered ping `seq`, reporting how long
        its oldest link probe per peer and its store's writer have waited."""
        if self.liveness is not None:
            self.liveness.answered(index, seq, time.monotonic(), links, store)

    def fail(self, index: int, reason: str) -> None:
        """Worker `index` met an error that no restart can mend (it says `reason`):
        stop every worker and make `run()` return 1, as when restarts run out."""
        log.error("%s: no restart can mend it, stopping all", reason)
        self._failed.add(index)
        if not self.exit_code:
            self.exit_code = 1
        self._write_status()
        self.stop()

    def stop(self) -> None:
        """Stop every worker and make `run()` return 0 (callable from a signal handler
        installed with `loop.add_signal_handler`)."""
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> int:
        """Start the workers, keep them up, and return 0 after `stop()`, or 1 when a
        worker died too often (the others are stopped first)."""
        self._stop = asyncio.Event()
        self.state = "running"
        tasks = [asyncio.create_task(self._keep(i)) for i in range(self.count)]
        watchdog = asyncio.create_task(self._watch()) if self.liveness is not None else None
        self._write_status()
        await self._stop.wait()
        if watchdog is not None:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
        self._stopping = True
        self.state = "stopping"
        self._write_status()
        for proc in list(self._procs.values()):
            _signal(proc, signal.SIGTERM)
        done, pending = await asyncio.wait(tasks, timeout=self.stop_timeout)
        if pending:
            for index, proc in list(self._procs.items()):
                log.warning("worker %d (pid %d) did not stop in time: killed", index, proc.pid)
                _signal(proc, signal.SIGKILL)
            await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("worker task failed", exc_info=task.exception())
        self.state = "failed" if self.exit_code else "stopped"
        self._write_status()
        return self.exit_code

    async def _keep(self, index: int) -> None:
        """Worker `index`'s lifetime: start, wait, restart, until the supervisor stops."""
        worker = self.workers[index]
        quick_deaths = 0
        assert self._stop is not None
        while not self._stop.is_set():
            worker.state = "starting"
            worker.ready = False
            worker.store_stuck = False
            started = time.monotonic()
            try:
                if self.on_start is not None:
                    self.on_start(index)
                proc = await asyncio.create_subprocess_exec(
                    *self.command(index),
                    env={
                        **self.env,
                        **(self.worker_env(index) if self.worker_env else {}),
                        "LEVERET_WORKER_INDEX": str(index),
                    },
                    pass_fds=tuple(self.pass_fds(index)) if self.pass_fds else (),
                    start_new_session=self.new_session,
                )
            except OSError as exc:
                log.error("worker %d could not start: %s", index, exc)
                worker.pid = None
                worker.last_exit = None
                rc: int | None = None
                if self.on_spawned is not None:
                    self.on_spawned(index)
            else:
                if self.on_spawned is not None:
                    self.on_spawned(index)
                self._procs[index] = proc
                worker.pid = proc.pid
                worker.started_at = time.time()
                worker.state = "running"
                log.info("worker %d started, pid %d", index, proc.pid)
                if self._stopping:  # stop() came while it was starting
                    _signal(proc, signal.SIGTERM)
                self._write_status()
                rc = await proc.wait()
                del self._procs[index]
                if self.liveness is not None:
                    self.liveness.gone(index)
                worker.last_exit = rc
            worker.ready = False
            if self.on_exit is not None:
                self.on_exit(index, rc)
            if self._stop.is_set():
                worker.state = "failed" if index in self._failed else "stopped"
                log.info("worker %d stopped (%s)", index, _describe(rc))
                self._write_status()
                return
            if self.require_ready and not worker.ever_started:
                # It never served: a port, the data dir or the configuration is wrong,
                # and restarting would only repeat the error it logged.
                worker.state = "failed"
                log.error("worker %d could not start (%s): stopping all", index, _describe(rc))
                if not self.exit_code:
                    self.exit_code = rc if rc is not None and rc > 0 else 1
                self._write_status()
                self.stop()
                return
            # An unrequested exit: restart, unless workers die too often.
            now = time.monotonic()
            self._restarts.append(now)
            while self._restarts and self._restarts[0] < now - self.restart_window:
                self._restarts.popleft()
            if len(self._restarts) > self.max_restarts:
                worker.state = "failed"
                log.error(
                    "worker %d exited (%s): more than %d restarts in %g s, stopping all",
                    index,
                    _describe(rc),
                    self.max_restarts,
                    self.restart_window,
                )
                self.exit_code = 1
                self._write_status()
                self.stop()
                return
            quick_deaths = 0 if now - started >= self.stable_after else quick_deaths + 1
            delay = min(self.backoff * 2 ** max(quick_deaths - 1, 0), self.max_backoff)
            worker.state = "restarting"
            worker.restarts += 1
            log.warning(
                "worker %d exited (%s), restart %d in %.2f s",
                index,
                _describe(rc),
                worker.restarts,
                delay,
            )
            self._write_status()
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
            except TimeoutError:
                pass
        worker.state = "stopped"
        self._write_status()

    async def _watch(self) -> None:
        """Ping the ready workers and kill those that stopped answering."""
        liveness = self.liveness
        assert liveness is not None and self.ping is not None
        while True:
            await asyncio.sleep(liveness.interval)
            pings, hung = liveness.tick(time.monotonic())
            for index, silent in hung:
                proc = self._procs.get(index)
                if proc is None:
                    continue
                worker = self.workers[index]
                worker.hangs += 1
                log.error(
                    "worker %d (pid %d) is hung: it answered no liveness ping for %.1f s "
                    "(timeout %g s; its event loop is stuck or the process is stopped): "
                    "killing it with SIGKILL to restart it",
                    index,
                    proc.pid,
                    silent,
                    liveness.timeout,
                )
                _signal(proc, signal.SIGKILL)
                self._write_status()
            kills, stores = liveness.stuck_parts()
            for index, peer, waited in kills:
                proc = self._procs.get(index)
                if proc is None:
                    continue
                self.workers[index].hangs += 1
                log.error(
                    "worker %d (pid %d) is stuck: its link with worker %d answered no round "
                    "trip for %.1f s (timeout %g s; a reader or writer of that link is stuck "
                    "while both event loops run): killing worker %d with SIGKILL to restart "
                    "it, which replaces the link",
                    index,
                    proc.pid,
                    peer,
                    waited,
                    liveness.timeout,
                    index,
                )
                _signal(proc, signal.SIGKILL)
                self._write_status()
            for index, waited, stuck in stores:
                self.workers[index].store_stuck = stuck
                if stuck:
                    log.error(
                        "worker %d's store writer has been on one write and fsync for %.1f s "
                        "(timeout %g s): the disk does not answer; not killed (a restart "
                        "would wait on the same disk), its persistent publishes wait",
                        index,
                        waited,
                        liveness.timeout,
                    )
                else:
                    log.warning("worker %d's store writer moves on again", index)
                self._write_status()
            for index, seq in pings:
                try:
                    self.ping(index, seq)
                except OSError as exc:  # it is exiting: its wait() reports how
                    log.debug("no ping to worker %d: %s", index, exc)
                except Exception:
                    log.exception("pinging worker %d", index)

    def _write_status(self) -> None:
        if not self.status_file:
            return
        doc = {
            "pid": os.getpid(),
            "state": self.state,
            "workers": [asdict(w) for w in self.workers],
        }
        tmp = f"{self.status_file}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, self.status_file)  # readers never see half a file
        except OSError as exc:
            # The file is a report for people and tools: a full disk (or any failed
            # write) must not stop the broker, which keeps serving what it holds.
            log.warning("could not write %s: %s", self.status_file, exc)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass  # it exited already; its wait() reports how


def _describe(rc: int | None) -> str:
    if rc is None:
        return "not started"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leveret.workers.supervisor",
        description="Run worker processes under a supervisor: restart one that dies, "
        "stop all on SIGTERM. {index} in the command is each worker's index.",
    )
    parser.add_argument("--workers", type=int, required=True, help="how many workers")
    parser.add_argument("--status-file", help="JSON of every worker's pid and state")
    parser.add_argument("--backoff", type=float, default=0.1, help="first restart delay, s")
    parser.add_argument("--max-backoff", type=float, default=5.0, help="longest delay, s")
    parser.add_argument("--max-restarts", type=int, default=10, help="restarts allowed ...")
    parser.add_argument("--restart-window", type=float, default=60.0, help="... in this many s")
    parser.add_argument("--stop-timeout", type=float, default=10.0, help="SIGKILL after, s")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("a worker command is needed after --")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sup = Supervisor(
        args.workers,
        lambda i: [part.replace("{index}", str(i)) for part in command],
        backoff=args.backoff,
        max_backoff=args.max_backoff,
        max_restarts=args.max_restarts,
        restart_window=args.restart_window,
        stop_timeout=args.stop_timeout,
        status_file=args.status_file,
    )

    async def supervise() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sup.stop)
        return await sup.run()

    return asyncio.run(supervise())


if __name__ == "__main__":
    sys.exit(main())
