"""Orchestrates one `leveret perf` run: topology, clients, measurement, clean-up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import struct
import sys
import time
from typing import Any, TextIO

from leveret.client import BasicProperties, ClientError
from leveret.perf.amqp import BrokerError, ConfirmTracker, PerfConnection, open_connection
from leveret.perf.options import BrokerAddress
from leveret.perf.stats import LIVE_HEADER, LatencySamples, live_line, ns_to_ms, percentile
from leveret.protocol.frames import body_frames
from leveret.protocol.methods import encode_publish
from leveret.protocol.properties import content_header_frame

COUNTERS = ("published", "confirmed", "nacked", "consumed")
_STAMP = struct.Struct(">Q")


def encode_message(
    exchange: str, routing_key: str, size: int, persistent: bool, frame_max: int, channel: int = 1
) -> tuple[bytes, bytes | None]:
    """Pre-encode one publish (method + header + body frames), with the protocol core's codecs.

    Returns (prefix, suffix): the 8-byte send timestamp goes between them. When the
    body is too small to carry a timestamp, returns (whole message, None).
    """
    method = encode_publish(channel, exchange, routing_key)
    props = BasicProperties(delivery_mode=2 if persistent else 1).encode()
    content = content_header_frame(channel, size, props)
    body = bytes(8) + b"x" * (size - 8) if size >= 8 else b"x" * size
    whole = method + content + b"".join(body_frames(channel, body, frame_max))
    if size < 8:
        return whole, None
    at = len(method) + len(content) + 7
    return whole[:at], whole[at + 8 :]


def consumer_queues(consumers: int, queues: list[str]) -> list[list[str]]:
    """Spread consumers over queues so that every queue has at least one consumer."""
    if consumers >= len(queues):
        return [[queues[j % len(queues)]] for j in range(consumers)]
    return [queues[j::consumers] for j in range(consumers)]


class PerfRun:
    """State of one run; `execute()` returns the summary dict."""

    def __init__(
        self,
        args: argparse.Namespace,
        address: BrokerAddress,
        queues: list[str],
        live: TextIO | None,
    ) -> None:
        self.args = args
        self.address = address
        self.queues = queues
        self.exchange = f"{args.queue_name}.fanout" if args.fanout else ""
        self.live = live
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.abort = asyncio.Event()
        self.stopping = False
        self.interrupted = False
        self.setup: PerfConnection | None = None
        self.producers: list[PerfConnection] = []
        self.consumers: list[PerfConnection] = []
        self.window = LatencySamples()
        self.measuring = False
        self.second_latencies: list[int] = []
        self.timeline: list[dict[str, Any]] = []
        self.started_at = 0.0
        self.window_start: tuple[float, dict[str, int]] | None = None
        self.window_end: tuple[float, dict[str, int]] | None = None
        self.declared_queues: list[str] = []
        self.declared_exchange = False

    # -- errors -----------------------------------------------------------------------

    def _error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)
        if not self.stopping:
            self.abort.set()

    def _interrupt(self) -> None:
        self.interrupted = True
        self.notes.append("interrupted; summary covers the time until then")
        self.abort.set()

    async def _connect(self, label: str) -> PerfConnection:
        a = self.address
        return await open_connection(
            a.host, a.port, a.user, a.password, a.vhost, label, self._error
        )

    # -- phases -----------------------------------------------------------------------

    async def execute(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
        try:
            await self._declare()
            await self._open_clients()
            await self._measure()
        except (BrokerError, ClientError) as exc:
            self._error(str(exc))
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)
            await self._shutdown()
        return self._result()

    async def _declare(self) -> None:
        self.setup = setup = await self._connect("setup")
        ch = setup.channel = await setup.conn.channel(confirms=False)
        a = self.args
        if a.fanout:
            await ch.declare_exchange(self.exchange, "fanout", durable=a.persistent)
            self.declared_exchange = True
        for q in self.queues:
            arguments = {"x-queue-type": a.queue_type} if a.queue_type != "classic" else None
            await ch.declare_queue(q, durable=a.persistent, arguments=arguments)
            self.declared_queues.append(q)
            if a.producers:  # consumer-only runs drain what is already there
                await ch.purge_queue(q)
            if a.fanout:
                await ch.bind_queue(q, self.exchange)

    async def _open_consumer(self, idx: int, queues: list[str]) -> PerfConnection:
        a = self.args
        conn = await self._connect(f"consumer {idx}")
        self.consumers.append(conn)
        ch = conn.channel = await conn.conn.channel(confirms=False)
        conn.manual_ack = not a.autoack
        if a.multi_ack_every is not None:
            conn.ack_every = max(1, a.multi_ack_every)
        else:
            conn.ack_every = max(1, a.prefetch // 4) if a.prefetch else 100
        prefetch = a.prefetch if not a.autoack and a.prefetch else None
        for q in queues:
            await ch.consume(
                q,
                prefetch=prefetch,
                no_ack=a.autoack,
                consumer_tag=f"perf-{idx}-{q}",
                on_delivery=conn.on_delivery,
            ).start()
        return conn

    async def _open_producer(self, idx: int) -> PerfConnection:
        conn = await self._connect(f"producer {idx}")
        self.producers.append(conn)
        conn.channel = ch = await conn.conn.channel(confirms=bool(self.args.confirm))
        if self.args.confirm:
            conn.confirms = ConfirmTracker()
            ch.add_confirm_listener(conn.confirms.on_confirm)
        return conn

    async def _open_clients(self) -> None:
        a = self.args
        assignments = consumer_queues(a.consumers, self.queues)
        await asyncio.gather(*(self._open_consumer(j, qs) for j, qs in enumerate(assignments)))
        await asyncio.gather(*(self._open_producer(i) for i in range(a.producers)))
        # Sort so "producer i"/"consumer j" labels match list positions after gather().
        self.consumers.sort(key=lambda c: int(c.label.split()[-1]))
        self.producers.sort(key=lambda c: int(c.label.split()[-1]))

    async def _sleep_or_abort(self, seconds: float) -> None:
        if seconds <= 0 or self.abort.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.abort.wait(), seconds)

    async def _measure(self) -> None:
        a = self.args
        self.started_at = time.monotonic()
        tasks = [
            asyncio.create_task(self._produce(conn, i)) for i, conn in enumerate(self.producers)
        ]
        ticker = asyncio.create_task(self._tick())
        try:
            await self._sleep_or_abort(a.warmup)
            if not self.abort.is_set():
                self._drain()
                self.window_start = (time.monotonic(), self._totals())
                self.measuring = True
                await self._sleep_or_abort(a.duration)
            if self.window_start is not None:
                self._drain()
                self.window_end = (time.monotonic(), self._totals())
                self.measuring = False
        finally:
            self.stopping = True
            ticker.cancel()
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(ticker, *tasks, return_exceptions=True)
            for res in results:
                if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                    self._error(f"internal error: {res!r}")

    # -- traffic ----------------------------------------------------------------------

    async def _produce(self, conn: PerfConnection, idx: int) -> None:
        """Publish in batches of pre-encoded frames, one timestamp per batch."""
        a = self.args
        if self.exchange:
            routing_key = ""
        else:
            routing_key = self.queues[idx % len(self.queues)]
        prefix, suffix = encode_message(
            self.exchange, routing_key, a.size, a.persistent, conn.frame_max, conn.channel.number
        )
        msg_len = len(prefix) + (len(suffix) + 8 if suffix is not None else 0)
        batch_max = max(1, min(1000, 16384 // msg_len))
        window = a.confirm
        tracker = conn.confirms
        rate = a.rate
        clock = time.monotonic
        stamp = time.monotonic_ns
        pack_ts = _STAMP.pack
        sleep = asyncio.sleep
        channel = conn.channel
        send = channel.send_encoded
        start = clock()
        sent = 0
        while not self.stopping and conn.error is None:
            if not channel.can_publish:
                await channel.wait_publishable()
                continue
            k = batch_max
            if window and tracker is not None:
                room = window - (conn.published - tracker.confirmed - tracker.nacked)
                if room <= 0:
                    tracker.room.clear()
                    await tracker.room.wait()
                    continue
                k = min(k, room)
            if rate:
                elapsed = clock() - start
                due = int(elapsed * rate) + 1 - sent
                if due <= 0:
                    await sleep(sent / rate - elapsed)
                    continue
                if due > rate:  # over a second behind (flow control): re-anchor, no burst
                    start = clock() - sent / rate
                    due = 1
                k = min(k, due)
            if suffix is None:
                data = prefix * k
            else:
                one = prefix + pack_ts(stamp()) + suffix
                data = one * k if k > 1 else one
            send(data, k)
            conn.published += k
            sent += k
            await sleep(0)

    def _totals(self) -> dict[str, int]:
        totals = dict.fromkeys(COUNTERS, 0)
        for conn in self.producers:
            totals["published"] += conn.published
            if conn.confirms is not None:
                totals["confirmed"] += conn.confirms.confirmed
                totals["nacked"] += conn.confirms.nacked
        for conn in self.consumers:
            totals["consumed"] += conn.consumed
        return totals

    def _drain(self) -> None:
        """Move consumer latency samples to the per-second list (and the window)."""
        for conn in self.consumers:
            if conn.latencies:
                values = conn.latencies
                conn.latencies = []
                if self.measuring:
                    self.window.add(values)
                self.second_latencies.extend(values)

    async def _tick(self) -> None:
        """Once a second: live line (unless --quiet) and a timeline entry."""
        last_t = self.started_at
        last = self._totals()
        next_t = last_t + 1.0
        if self.live is not None:
            print(LIVE_HEADER, file=self.live, flush=True)
        while True:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            next_t += 1.0
            now = time.monotonic()
            self._drain()
            for conn in self.consumers:
                conn.flush_acks()
            totals = self._totals()
            dt = max(now - last_t, 1e-9)
            rates = {k: (totals[k] - last[k]) / dt for k in COUNTERS}
            samples = self.second_latencies
            self.second_latencies = []
            p50 = p99 = None
            if samples:
                samples.sort()
                p50, p99 = ns_to_ms(percentile(samples, 50)), ns_to_ms(percentile(samples, 99))
            elapsed = now - self.started_at
            warm = self.window_start is None
            self.timeline.append(
                {"t": round(elapsed, 2), "warmup": warm}
                | {f"{k}_per_s": round(v, 1) for k, v in rates.items()}
                | {"p50_ms": p50, "p99_ms": p99}
            )
            if self.live is not None:
                line = live_line(
                    elapsed,
                    rates["published"],
                    rates["confirmed"],
                    rates["consumed"],
                    p50,
                    p99,
                    warm,
                )
                print(line, file=self.live, flush=True)
            last_t, last = now, totals

    # -- teardown ---------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self.stopping = True
        clients = self.producers + self.consumers
        await asyncio.gather(*(c.close(timeout=3.0) for c in clients), return_exceptions=True)
        if self.args.keep or not (self.declared_queues or self.declared_exchange):
            if self.setup is not None:
                await self.setup.close()
            return
        conn = self.setup
        try:
            if conn is None or conn.error is not None or conn.closed or not conn.channel.is_open:
                conn = await self._connect("clean-up")
                conn.channel = await conn.conn.channel(confirms=False)
            for q in self.declared_queues:
                await conn.channel.delete_queue(q)
            if self.declared_exchange:
                await conn.channel.delete_exchange(self.exchange)
        except (BrokerError, ClientError) as exc:
            self.notes.append(f"clean-up incomplete: {exc}")
        finally:
            if conn is not None:
                await conn.close()
            if self.setup is not None and self.setup is not conn:
                await self.setup.close()

    def _result(self) -> dict[str, Any]:
        a = self.args
        counts = dict.fromkeys(COUNTERS, 0)
        window_s = 0.0
        if self.window_start is not None and self.window_end is not None:
            (t0, c0), (t1, c1) = self.window_start, self.window_end
            window_s = t1 - t0
            counts = {k: c1[k] - c0[k] for k in COUNTERS}
        result: dict[str, Any] = {"broker": str(self.address)}
        for k in COUNTERS:
            result[k] = counts[k]
            result[f"{k}_per_s"] = round(counts[k] / window_s, 1) if window_s else 0.0
        notes = list(self.notes)
        if a.size < 8:
            notes.append("latency not measured: --size below 8 bytes leaves no room for a stamp")
        for conn in [self.setup, *self.producers, *self.consumers]:
            if conn is not None:
                notes.extend(conn.notes)
        result |= {
            "latency_ms": self.window.summary(),
            "window_s": round(window_s, 3),
            "warmup_s": a.warmup,
            "errors": list(self.errors),
            "notes": notes,
            "ok": not self.errors,
            "config": {
                "producers": a.producers,
                "consumers": a.consumers,
                "queues": self.queues,
                "exchange": self.exchange,
                "size": a.size,
                "persistent": a.persistent,
                "confirm": a.confirm,
                "prefetch": a.prefetch,
                "autoack": a.autoack,
                "multi_ack_every": a.multi_ack_every,
                "fanout": a.fanout,
                "rate": a.rate,
                "duration": a.duration,
                "warmup": a.warmup,
            },
            "timeline": self.timeline,
        }
        return result


def run_async(coro_factory: Any) -> Any:
    """Run on uvloop when it is installed: the client must not be the bottleneck."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro_factory())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro_factory())


def execute(args: argparse.Namespace, address: BrokerAddress, queues: list[str]) -> dict[str, Any]:
    live = None if args.quiet else (sys.stderr if args.json else sys.stdout)

    async def go() -> dict[str, Any]:
        return await PerfRun(args, address, queues, live).execute()

    result = run_async(go)
    return result
