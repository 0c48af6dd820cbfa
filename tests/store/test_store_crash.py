"""kill -9 while appending: everything reported durable must come back intact."""

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
from store_support import recovered_state

from leveret.store import MessageStore

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from leveret.store import MessageStore

    def body_for(n):
        return (b"%d:" % n) * (1 + n % 40)

    async def main(data_dir, start):
        loop = asyncio.get_running_loop()
        store = MessageStore(data_dir, segment_size=32 * 1024, fsync="batch", loop=loop)
        store.open()
        out = sys.stdout

        outstanding = [0]

        def durable(n):
            outstanding[0] += 1
            def cb(exc):
                outstanding[0] -= 1
                if exc is None:
                    out.write("%d\\n" % n)
                    out.flush()
            return cb

        n = start
        churn = []
        while True:
            for _ in range(50):
                store.publish(("/", "keep"), b"h%d" % n, body_for(n), durable(n))
                churn.append(store.publish(("/", "churn"), b"", b"c" * (n % 300)))
                if len(churn) > 20:
                    store.ack(churn.pop(0))
                n += 1
            await asyncio.sleep(0)
            # Like a publisher's confirm window: never run unboundedly ahead of the disk.
            while outstanding[0] > 2000:
                await asyncio.sleep(0.001)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def body_for(n: int) -> bytes:
    return (b"%d:" % n) * (1 + n % 40)


def _read_lines(proc: subprocess.Popen, lines: list[bytes], started: threading.Event) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        started.set()
    started.set()


@pytest.mark.soak
def test_sigkill_during_appends_loses_nothing_durable(tmp_path: Path, soak_rounds: int) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    data = tmp_path / "data"
    rng = random.Random()
    durable: set[int] = set()
    start = 0
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for _round in range(soak_rounds + 1):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(data), str(start)],
            stdout=subprocess.PIPE,
            env=env,
        )
        lines: list[bytes] = []
        started = threading.Event()

        reader = threading.Thread(target=_read_lines, args=(proc, lines, started))
        reader.start()
        try:
            assert started.wait(30), "writer never reported anything durable"
            time.sleep(rng.uniform(0.02, 0.4))  # kill at a random moment mid-stream
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join()
        reported = {int(line) for line in lines if line.endswith(b"\n")}
        assert reported, "writer reported nothing durable"
        durable |= reported
        # The segment summaries the killed writer left give the same recovery as
        # walking every record (a copy without them), torn tail and all.
        walk = tmp_path / f"walk{_round}"
        shutil.copytree(data, walk)
        for f in (walk / "msgs").glob("*.sum"):
            f.unlink()
        walked, _ = recovered_state(walk, 32 * 1024)
        summarised, how = recovered_state(data, 32 * 1024)
        assert summarised == walked
        assert how["summaries"] > 0 or _round == 0
        shutil.rmtree(walk)
        store = MessageStore(str(data), segment_size=32 * 1024)
        recovered = store.open()
        keep = recovered[("/", "keep")]
        found = {}
        for loc in keep:
            header, body = store.read_body(loc)
            n = int(header[1:])
            assert body == body_for(n)
            found[n] = loc.msg_id
        missing = durable - found.keys()
        assert not missing, f"lost {len(missing)} durable messages, e.g. {sorted(missing)[:5]}"
        ids = [found[n] for n in sorted(found)]
        assert ids == sorted(ids)  # publish order
        assert len(recovered.get(("/", "churn"), [])) <= 21 * 50
        store.close()
        start = max(found) + 1
