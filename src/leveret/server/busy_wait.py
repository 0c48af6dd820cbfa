"""Busy waiting: after traffic, the event loop polls for a while instead of sleeping.

Why: on a virtual machine a CPU with nothing to run halts, and waking it again when the
next packet arrives costs tens of microseconds (the host has to deliver an interrupt and
re-enter the guest), with caches that other work may have cooled meanwhile. At moderate
rates, where every message finds the broker asleep, that wake-up is most of a message's
latency. Erlang's schedulers can do the same (`+sbwt`); RabbitMQ 3.10 starts Erlang with
`+sbwt none`, so by default Leveret does not busy-wait either (`busy_wait_us = 0`).

How: every read arms a deadline `busy_wait_us` ahead. Until it passes, a callback keeps
re-scheduling itself with `call_soon`, so the loop's poll for I/O uses a zero timeout and
the thread never blocks. Nothing else waits behind the spin: each turn is one callback
among the others, sockets and other threads' `call_soon_threadsafe` are polled every turn,
and timers are checked every turn. The cost is CPU: the loop thread stays busy for up to
`busy_wait_us` after each read, so under steady traffic it uses a whole core. Once no read
arrives for that long, the loop sleeps until the next event.
"""

from __future__ import annotations

import asyncio
import os
import time

_sched_yield = getattr(os, "sched_yield", lambda: None)  # (not on Windows)


class BusyWait:
    """Keep `loop` polling for `window_us` microseconds after the last `arm()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int) -> None:
        if window_us <= 0:
            raise ValueError(f"busy_wait_us must be positive, got {window_us}")
        self.loop = loop
        self.window_ns = window_us * 1000
        self.deadline = 0  # time.monotonic_ns() until which the loop keeps polling
        self.spinning = False  # a spin callback is scheduled
        self.fresh = False  # arm() was called since the last turn
        self.turns = 0  # loop turns spent polling (the tests read it)

    def arm(self) -> None:
        """A read was handled: poll at least `window_us` from now.

        Called once a read on the hot path, so while a spin is already scheduled it
        does no more than a clock read and two stores."""
        self.deadline = time.monotonic_ns() + self.window_ns
        self.fresh = True
        if not self.spinning:
            self.spinning = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        """One loop turn of polling: schedule the next, or stop once the window passed."""
        self.turns += 1
        if self.fresh:  # a read since the last turn: busy, not waiting; poll again
            self.fresh = False
            self.loop.call_soon(self._turn)
        elif time.monotonic_ns() < self.deadline:
            # Nothing came in: let whatever else is runnable on this CPU go first. A
            # client woken by the broker's write is often queued on the broker's own
            # CPU, and would otherwise wait out the whole window behind a thread that
            # never blocks (without the yield, S3's p99 is the window itself:
            # docs/benchmarks.md#s3).
            _sched_yield()
            self.loop.call_soon(self._turn)
        else:
            self.spinning = False
