"""The shared-memory ring between two processes: bytes arrive whole and in order
through a ring much smaller than what passes, with both sides sleeping and waking."""

from __future__ import annotations

import multiprocessing

from leveret.workers.link import LinkReader, LinkWriter, Publish
from leveret.workers.ring import Ring

FORK = multiprocessing.get_context("fork")
N = 20_000


def _produce(ring: Ring) -> None:
    w = LinkWriter()
    for seq in range(1, N + 1):
        w.publish(seq, "/", ["q"], bytes([seq % 256]) * (seq % 300))
        if seq % 37 == 0:
            ring.write(w.data_to_send())
    ring.write(w.data_to_send())
    ring.close()


def test_records_pass_through_a_small_ring_in_order() -> None:
    ring = Ring.create(4096)  # far smaller than the 3 MB that pass: it wraps and fills
    child = FORK.Process(target=_produce, args=(ring,))
    child.start()
    try:
        reader = LinkReader()
        got: list[Publish] = []
        while len(got) < N:
            got += reader.feed(ring.read())  # type: ignore[arg-type]
        child.join(30)
        assert child.exitcode == 0
        assert [p.seq for p in got] == list(range(1, N + 1))
        assert all(p.message == bytes([p.seq % 256]) * (p.seq % 300) for p in got)
    finally:
        ring.close()
        ring.unlink()
