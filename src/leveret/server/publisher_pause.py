"""Why a connection's socket is not being read: the publisher pauses in one place.

A connection stops being read for four independent reasons, each ending on its
own:

- flow: a queue it publishes into is FLOW_LIMIT messages behind its consumers,
  until every such queue has drained (the queue calls resume_after_flow);
- alarm: it published while a memory or disk alarm was on, until the alarm clears;
- disk: the store's write backlog grew too long, until the committer catches up;
- recovery: it asked for something while the broker was still reading its stored
  messages back after a restart, until that is done (the connection holds the
  operation and runs it then);
- call: in a broker of several workers, one of its methods waits for the answer
  of the worker that owns a queue (the connection holds what follows).

Reading resumes only when no reason is left. The connection asks this object
and nothing else, so no resume path needs to know about the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class PublisherPause:
    __slots__ = (
        "flow",
        "alarm",
        "disk",
        "recovery",
        "call",
        "_paused",
        "_pause",
        "_resume",
        "closed",
    )

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self.flow: set[Any] = set()  # queues this publisher waits for
        self.alarm = False
        self.disk = False
        self.recovery = False
        self.call = False
        self.closed = False
        self._paused = False
        self._pause, self._resume = pause, resume  # the transport's pause/resume_reading

    @property
    def reasons(self) -> list[str]:
        """For logs and tests: what holds the publisher back now."""
        return [
            r
            for r, on in (
                ("flow", self.flow),
                ("alarm", self.alarm),
                ("disk", self.disk),
                ("recovery", self.recovery),
                ("call", self.call),
            )
            if on
        ]

    def _apply(self) -> None:
        if self.closed:
            return  # the connection is gone: its transport is not ours to touch
        want = bool(self.flow or self.alarm or self.disk or self.recovery or self.call)
        if want != self._paused:
            self._paused = want
            (self._pause if want else self._resume)()

    def start_flow(self, queue: Any) -> None:
        self.flow.add(queue)
        self._apply()

    def end_flow(self, queue: Any) -> None:
        self.flow.discard(queue)
        self._apply()

    def start_alarm(self) -> None:
        self.alarm = True
        self._apply()

    def end_alarm(self) -> None:
        self.alarm = False
        self._apply()

    def start_disk(self) -> None:
        self.disk = True
        self._apply()

    def end_disk(self) -> None:
        self.disk = False
        self._apply()

    def start_recovery(self) -> None:
        self.recovery = True
        self._apply()

    def end_recovery(self) -> None:
        self.recovery = False
        self._apply()

    def start_call(self) -> None:
        self.call = True
        self._apply()

    def end_call(self) -> None:
        self.call = False
        self._apply()

    def close(self) -> set[Any]:
        """The connection is gone: the queues that still hold it, to forget it."""
        self.closed = True
        queues, self.flow = self.flow, set()
        return queues
