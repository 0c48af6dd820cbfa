#!/usr/bin/env python3
"""S3's latency taken apart: where a message's time goes between amqbench and back.

    python bench/latency_split.py [--rate 5000] [--seconds 6] [--rounds 3]
                                  [--pin-broker CPU] [--pin-client CPU]

amqbench (the referee, `--rate` messages a second, 16 B, one producer and one consumer
in one process) writes `time.monotonic_ns()` into each body and measures publish to
receipt. CLOCK_MONOTONIC is the same clock in every process, so a broker that reads
that stamp can say how much of the latency is before it, in it and after it. This
script starts `leveret server` from this tree with timing wrappers around three
methods, set on the Python class `AMQPConnection` (its compiled base, ConnectionIO,
finds them as overrides; the compiled code itself runs as usual):

- `AMQPConnection.get_buffer` (server/connection.py): where the read lands; the bytes
  read are scanned for body frames and the stamp of each is paired with the time the
  read began;
- `AMQPConnection.buffer_updated` (server/connection.py): when the read began and when
  everything it held was parsed, routed and queued for the consumer's socket;
- `AMQPConnection._flush`: when the delivery's write began and when the write call
  returned.

Per message it reports (percentiles in microseconds):

- `send_to_read`: amqbench's stamp to the start of the broker's read: the client's
  write, the kernel, and the broker's wake-up (scheduling included);
- `read_to_processed`: the whole read handled, including any other messages in it;
- `processed_to_flush`: the rest of the loop turn before the output flush;
- `write_call`: the `transport.write` of the delivery (the send system call);
- `send_to_written`: the broker's whole share plus what came before it;

`tail`: for the slowest 1% by the broker's whole share, the median of each part and
of the time spent in other reads (the consumer's acks) meanwhile. A delivery written
while its read is still being handled (the usual case since deliveries are flushed at
the end of the read) counts its read as handled up to the write;

and for the broker's event-loop thread, from /proc/PID/task/PID/schedstat over the
measured seconds: CPU time and run-queue wait per message, and how many times it
was put on a CPU. amqbench's own p50/p99 come beside them. The wrappers cost about a
microsecond a read; figures are for comparing parts, not for the bar (`bench/compare`
gives that). The management and Prometheus listeners are on, on free ports, as
`bench/compare` runs the broker. `--pin-broker`/`--pin-client` run the broker or amqbench on one CPU
(taskset), to see what sharing a CPU costs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))

# Run inside the broker process: wrap the methods, then `leveret server` as usual.
BOOTSTRAP = r"""
import atexit, json, os, struct, sys, time
from leveret.server import connection as sc

OUT = os.environ["LATENCY_SPLIT_OUT"]
PAT = b"\x03\x00\x01\x00\x00\x00\x10"  # a body frame on channel 1, 16 bytes: amqbench's
now = time.monotonic_ns
stamp = struct.Struct(">Q").unpack_from
state = {"read_at": 0, "stamps": []}
reads = {}       # stamp -> (read began, read processed)
samples = []     # (stamp, read began, processed, flush began, written)
per_read = []    # messages in each read that held any
other_reads = [] # (began, done) of reads without a timed message (acks, mostly)

def stamps_in(data):
    found, i = [], data.find(PAT)
    while i >= 0 and i + 15 <= len(data):
        found.append(stamp(data, i + 7)[0])
        i = data.find(PAT, i + 15)
    return found

get_buffer = sc.AMQPConnection.get_buffer
def kept_get_buffer(self, sizehint):
    state["placed"] = view = get_buffer(self, sizehint)
    return view
sc.AMQPConnection.get_buffer = kept_get_buffer

buffer_updated = sc.AMQPConnection.buffer_updated
def timed_buffer_updated(self, nbytes):
    began = now()
    # The bytes just read (SharedReadBuffer is a C type when compiled, so its take
    # cannot be wrapped: the view get_buffer handed out is read instead).
    state["stamps"] = stamps_in(bytes(state["placed"][:nbytes]))
    state["read_at"] = began
    buffer_updated(self, nbytes)
    if state["stamps"]:
        done = now()
        per_read.append(len(state["stamps"]))
        for s in state["stamps"]:
            reads.setdefault(s, (began, done))
    else:
        other_reads.append((began, now()))
sc.AMQPConnection.buffer_updated = timed_buffer_updated

flush = sc.AMQPConnection._flush
def timed_flush(self):
    out = self._out
    found = stamps_in(b"".join(out)) if out and not self._out_large else ()
    began = now()
    flush(self)
    if found:
        written = now()
        for s in found:
            r = reads.pop(s, None)
            if r is None and s in state["stamps"]:  # flushed before its read returned
                r = (state["read_at"], began)
            if r is not None:
                samples.append((s, r[0], r[1], began, written))
sc.AMQPConnection._flush = timed_flush

def dump():
    with open(OUT, "w") as f:
        json.dump({"samples": samples, "per_read": per_read, "other_reads": other_reads}, f)
atexit.register(dump)

from leveret.cli import main
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the broker exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the broker did not listen on {port} within {timeout} s")


def schedstat(pid: int) -> tuple[int, int, int]:
    run, wait, slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(run), int(wait), int(slices)


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


PCTS = (50, 90, 99, 99.9)


def summary(xs: list[float]) -> dict[str, float | None]:
    return {f"p{p}": None if (v := pct(xs, p)) is None else round(v, 1) for p in PCTS}


def tail(rows: list[list[int]], other: list[list[int]]) -> dict[str, object]:
    """The slowest 1% by the broker's whole share: what their time went to.

    Medians over those messages of each part, and of the time the broker spent in
    other reads (the consumer's acks) between the stamp and the delivery's write."""
    if not rows:
        return {}
    rows = sorted(rows, key=lambda r: r[4] - r[0])
    worst = rows[-max(1, len(rows) // 100) :]
    other = sorted(other)
    starts = [o[0] for o in other]

    def in_other(r: list[int]) -> float:
        i, busy = bisect.bisect_left(starts, r[0] - 1_000_000), 0
        while i < len(other) and other[i][0] < r[3]:
            b, d = other[i]
            busy += max(0, min(d, r[3]) - max(b, r[0]))
            i += 1
        return busy

    def med(xs: list[float]) -> float:
        return round(sorted(xs)[len(xs) // 2] * 1e-3, 1)

    return {
        "messages": len(worst),
        "send_to_written_us": med([r[4] - r[0] for r in worst]),
        "send_to_read_us": med([r[1] - r[0] for r in worst]),
        "read_to_processed_us": med([r[2] - r[1] for r in worst]),
        "processed_to_flush_us": med([r[3] - r[2] for r in worst]),
        "write_call_us": med([r[4] - r[3] for r in worst]),
        "in_other_reads_us": med([in_other(r) for r in worst]),
        "with_other_reads": sum(1 for r in worst if in_other(r) > 0),
    }


def one_round(args: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-latency-split-")
    out = os.path.join(data_dir, "split.json")
    env = dict(os.environ, LATENCY_SPLIT_OUT=out)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE.parent / "src"), env.get("PYTHONPATH")])
    )
    argv = [sys.executable, "-c", BOOTSTRAP, "server", "--workers", "1", "--mqtt-port", "0", "--web-mqtt-port", "0", "--port", str(port), "--data-dir", data_dir,
            "--management-port", str(free_port()), "--prometheus-port", str(free_port())]  # fmt: skip
    if args.pin_broker is not None:
        argv = ["taskset", "-c", str(args.pin_broker), *argv]
    log = open(os.path.join(data_dir, "server.log"), "wb")  # noqa: SIM115
    broker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_port(port, broker)
        bench = [sys.executable, str(AMQBENCH), "--port", str(port), "--seconds", str(args.seconds),
                 "--warmup", "2", "--rate", str(args.rate), "--size", "16"]  # fmt: skip
        if args.pin_client is not None:
            bench = ["taskset", "-c", str(args.pin_client), *bench]
        client = subprocess.Popen(bench, stdout=subprocess.PIPE, text=True)
        time.sleep(2.5)  # amqbench's set-up and warm-up
        before, t0 = schedstat(broker.pid), time.monotonic()
        time.sleep(max(1.0, args.seconds - 1.0))
        after, took = schedstat(broker.pid), time.monotonic() - t0
        stdout, _ = client.communicate(timeout=60)
        result = json.loads(stdout.strip().splitlines()[-1])
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()
        log.close()
    split = json.loads(Path(out).read_text())
    us = 1e-3
    rows = split["samples"]
    messages = result["consumed_per_s"] * took
    per_read = split["per_read"]
    return {
        "amqbench_p50_ms": result["lat_ms_p50"],
        "amqbench_p99_ms": result["lat_ms_p99"],
        "messages_timed": len(rows),
        "messages_per_read": round(sum(per_read) / max(1, len(per_read)), 2),
        "send_to_read_us": summary([(r[1] - r[0]) * us for r in rows]),
        "read_to_processed_us": summary([(r[2] - r[1]) * us for r in rows]),
        "processed_to_flush_us": summary([(r[3] - r[2]) * us for r in rows]),
        "write_call_us": summary([(r[4] - r[3]) * us for r in rows]),
        "send_to_written_us": summary([(r[4] - r[0]) * us for r in rows]),
        "tail": tail(rows, split["other_reads"]),
        "loop_thread": {
            "cpu_us_per_message": round((after[0] - before[0]) * us / messages, 1),
            "runqueue_wait_us_per_message": round((after[1] - before[1]) * us / messages, 1),
            "times_on_cpu_per_message": round((after[2] - before[2]) / messages, 2),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pin-broker", type=int, default=None, metavar="CPU")
    p.add_argument("--pin-client", type=int, default=None, metavar="CPU")
    args = p.parse_args()
    if not AMQBENCH.exists():
        raise SystemExit(f"amqbench not found at {AMQBENCH}; set AMQBENCH")
    for i in range(args.rounds):
        print(json.dumps({"round": i + 1, **one_round(args)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
