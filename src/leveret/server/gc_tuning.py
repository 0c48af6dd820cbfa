"""Garbage-collector settings for the broker process (`leveret server` only).

CPython's cycle collector runs a generation-0 pass every 700 net allocations,
and a full pass, which walks every tracked object, once enough survivors pile up.
A broker allocates per message and keeps many long-lived objects (queues,
connections, bindings, queued messages), so with the defaults the full passes
come often and each one stalls the event loop. With 10,000 queues and 1,000 idle
connections under S1 (docs/benchmarks.md#s1; `bench/management_load.py`) the
defaults run about a hundred full passes a minute of 60-70 ms each; the thresholds
below run none, and S1 and the management API's tail latency both improve
(docs/benchmarks.md#management-api has the figures).

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
