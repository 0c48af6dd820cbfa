"""Garbage-collector settings for the broker process (`leveret server` only).

CPython's cycle collector runs a generation-0 pass every 700 net allocations,
and a full pass, which walks every tracked object, once enough survivors pile up.
A broker allocates per message and keeps many long-lived objects (queues,
connections, bindings, queued messages), so with the defaults the full passes
come often and each one stalls the event loop. Measured with 10,000 queues and
1,000 idle connections while S1 ran (bench/management_load.py, 2026-11-25):
112 full passes of 63 to 67 ms each in about a minute; with the thresholds below
none, S1 went from about 122,000 to 150,000 msg/s and /api/overview's p95 from
78 ms to 25 ms.

Reference counting still frees everything that is not in a cycle at once; the
broker's cycles (a closed channel and its connection, a deleted queue and its
consumers) are rare and wait a little longer to be collected.

The embedded test broker (leveret.testing) runs inside someone else's process and
leaves its garbage collector alone.
"""

from __future__ import annotations

import gc

# (generation 0 allocations, gen-0 passes per gen-1 pass, gen-1 passes per full pass)
THRESHOLDS = (50_000, 20, 10)


def tune() -> None:
    gc.set_threshold(*THRESHOLDS)
