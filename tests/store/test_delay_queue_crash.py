"""kill -9 while a delay queue is written, taken from and compacted: every message
reported durable and not yet taken comes back, in due order, intact; and recovery
from the segment summaries equals walking every segment.

A writer subprocess adds delay records (due times in a virtual clock a day ahead of
now, so compaction never holds back), takes and acks what its clock has reached,
and keeps another queue churning on tiny segments so that the log rolls and
compaction copies delay records all the time.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from leveret.store import MessageStore
from leveret.store.delay_index import TRANSIENT_BIT
from leveret.store.delay_queue import DUE, DUE_AT, is_delay_key
from leveret.store.records import PUB_FIXED, PUB_HEAD
from leveret.store.segments import PREFIX_SIZE

SEG = 32 * 1024

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from leveret.store import MessageStore

    def due_of(n, base):
        return base + (n * 7919) % 20000

    async def main(data_dir, start, base, clock):
        loop = asyncio.get_running_loop()
        store = MessageStore(data_dir, segment_size=32 * 1024, fsync="batch", loop=loop)
        store.open_paged()
        dq = store.delays
        index = dq.index("/", "dx")
        churn = store.paged_index(("/", "churn"))
        out = sys.stdout
        outstanding = [0]

        def durable(n):
            outstanding[0] += 1
            def cb(exc):
                outstanding[0] -= 1
                if exc is None:
                    out.write("d %d\\n" % n)
            return cb

        n = start
        while True:
            for _ in range(40):
                dq.add(index, due_of(n, base), b"%d" % n, b"body %d" % n * (1 + n % 30),
                       durable(n), False)
                store.publish_paged(churn, b"", b"c" * (n % 200))
                n += 1
            if len(churn) > 60:
                for loc, _h, _b in store.take_paged(churn, 50):
                    store.ack(loc)
            clock += 150
            with dq.paused():
                for due, header, body, token in dq.take(index, clock, 60):
                    dq.ack(index, token)
                    out.write("t %s %d\\n" % (header.decode(), due))
            out.flush()
            await asyncio.sleep(0)
            while outstanding[0] > 2000:
                await asyncio.sleep(0.001)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    """
)


def _read_lines(proc: subprocess.Popen, lines: list[bytes], started: threading.Event) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        started.set()
    started.set()


def _recovered(path: Path) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    store = MessageStore(str(path), segment_size=SEG)
    store.prepare()
    recovered = store.recover()
    rows = [row for key, index in recovered.items() if is_delay_key(key) for row in index.entries()]
    live = dict(store._live)
    store._log.committer.close()  # type: ignore[union-attr]
    return rows, live


@pytest.mark.soak
def test_sigkill_while_delay_records_are_added_taken_and_compacted(
    tmp_path: Path, soak_rounds: int
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    data = tmp_path / "data"
    rng = random.Random()
    base = time.time_ns() // 1_000_000 + 86_400_000
    clock = base
    durable: set[int] = set()
    taken: set[int] = set()
    start = 0
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for _round in range(soak_rounds + 1):
        argv = [sys.executable, str(script), str(data), str(start), str(base), str(clock)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
        lines: list[bytes] = []
        started = threading.Event()
        reader = threading.Thread(target=_read_lines, args=(proc, lines, started))
        reader.start()
        try:
            assert started.wait(30), "writer never reported anything"
            time.sleep(rng.uniform(0.1, 0.6))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join()
        for line in lines:
            if not line.endswith(b"\n"):
                continue
            kind, n, *rest = line.split()
            if kind == b"d":
                durable.add(int(n))
            else:
                taken.add(int(n))
                clock = max(clock, int(rest[0]))
        # The summaries the killed writer left give the same recovery as a walk.
        walk = tmp_path / f"walk{_round}"
        shutil.copytree(data, walk)
        for f in (walk / "msgs").glob("*.sum"):
            f.unlink()
        assert _recovered(data) == _recovered(walk)
        shutil.rmtree(walk)
        store = MessageStore(str(data), segment_size=SEG)
        recovered = store.open_paged()
        index = recovered[("/", "dx", "delayed")]
        pending = []
        for due, pos, size in index.entries():
            assert not size & TRANSIENT_BIT
            record = store._log.read(pos >> 32, pos & 0xFFFFFFFF, size)  # type: ignore[union-attr]
            _t, _f, _q, _mid, hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)
            assert DUE.unpack_from(record, DUE_AT)[0] == due
            n = int(record[DUE_AT + DUE.size : PUB_HEAD + hlen])
            assert record[PUB_HEAD + hlen :] == b"body %d" % n * (1 + n % 30)
            pending.append((due, n))
        assert pending == sorted(pending)  # by due time, then in the order added
        found = {n for _d, n in pending}
        lost = durable - taken - found
        assert not lost, f"lost {len(lost)} durable delayed messages, e.g. {sorted(lost)[:5]}"
        assert len(found) == len(pending)  # no message twice
        store.close()
        start = max([start, *durable, *found, *taken]) + 1
    assert len(durable) > 200 and len(taken) > 50
