"""Last wills: published when a client goes without a DISCONNECT, maybe after a delay.

MQTT 5's Will Delay Interval holds the will back; a new connection with the same
client id in the meantime cancels it (MQTT 3.1.3.2.2). Wills that wait are kept
here by client id, so a reconnecting client finds and cancels its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class PendingWills:
    """Delayed wills by client id."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def schedule(self, client_id: str, delay: float, publish: Callable[[], None]) -> None:
        self.cancel(client_id)

        def fire() -> None:
            self._timers.pop(client_id, None)
            publish()

        self._timers[client_id] = self.loop.call_later(delay, fire)

    def cancel(self, client_id: str) -> bool:
        """Drop the will `client_id` left, if one waits; True if one did."""
        timer = self._timers.pop(client_id, None)
        if timer is None:
            return False
        timer.cancel()
        return True

    def cancel_all(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._timers)
