"""Resource alarms: block publishers when memory or disk runs short, as RabbitMQ does.

While an alarm is on, every client that advertised the `connection.blocked`
capability is told so, and a connection that publishes stops being read until
the alarm clears. Consumers keep running, which is what frees the resources.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leveret.server.listener import Server

log = logging.getLogger("leveret.alarms")

CHECK_INTERVAL = 1.0


def resident_bytes() -> int:
    """This process's resident set size (Linux), or 0 where /proc is not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class ResourceAlarms:
    def __init__(
        self, server: Server, memory_limit: int, disk_free_limit: int, disk_path: str | None
    ) -> None:
        self.server = server
        self.memory_limit = memory_limit  # bytes of RSS; 0 = off
        self.disk_free_limit = disk_free_limit  # bytes free under data dir; 0 = off
        self.disk_path = disk_path
        self.active: set[str] = set()  # "memory", "disk"
        self._timer: asyncio.TimerHandle | None = None

    @property
    def blocking(self) -> bool:
        return bool(self.active)

    @property
    def reason(self) -> str:
        return " & ".join(f"low on {what}" for what in sorted(self.active))

    def start(self) -> None:
        self.check()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def check(self) -> None:
        self._timer = None
        self._set("memory", bool(self.memory_limit) and resident_bytes() > self.memory_limit)
        free = self._disk_free()
        self._set("disk", free is not None and free < self.disk_free_limit)
        self._timer = self.server.loop.call_later(CHECK_INTERVAL, self.check)

    def _disk_free(self) -> int | None:
        if not self.disk_free_limit or not self.disk_path:
            return None
        try:
            st = os.statvfs(self.disk_path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _set(self, what: str, on: bool) -> None:
        if on == (what in self.active):
            return
        was_blocking = self.blocking
        if on:
            self.active.add(what)
            log.warning(
                "resource alarm: %s; publishers are blocked until it clears", f"low on {what}"
            )
        else:
            self.active.discard(what)
            log.info("resource alarm cleared: %s", what)
        for conn in list(self.server.connections):
            if self.blocking:
                conn.alarm_raised(self.reason)
            elif was_blocking:
                conn.alarm_cleared()
