#!/usr/bin/env python3
"""CPU time per message when messages cross between workers, against staying local.

    PYTHONPATH=src python bench/workers_crossing.py [--seconds 4] [--runs 3]
        [--size 16] [--persistent] [--confirm 500] [--prefetch 500]

Two worker Nodes of one broker run in this process, on one event loop
(tests/workers/inprocess.py), linked by a real socket pair; the queue is owned by
worker 1. A producer process and a consumer process (raw AMQP frames, pipelined,
as bench's referee amqbench does) connect to:

- `local`: both to worker 1, the queue's owner: nothing crosses;
- `publish crosses`: the producer to worker 0, the consumer to worker 1: each
  message is a PUBLISH record (and its confirm a CONFIRM record);
- `both cross`: both to worker 0: PUBLISH there, DELIVER back, ACK there again.

The figure is this process's CPU time (user + system, both workers together,
`resource.getrusage`) over the measured window, divided by the messages consumed
in it; the clients' CPU is theirs (other processes). Each figure is the median of
`--runs` runs, the scenarios taking turns within each round. On one loop the two
workers share a core, so the rate is not what two worker processes give; the CPU
per message is what crossing costs. The process runs the garbage collector with a
worker process's thresholds (server/gc_tuning.py; `--default-gc`: CPython's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import resource
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from pamqp import commands as C  # noqa: E402
from pamqp import frame as pframe  # noqa: E402
from pamqp import header as H  # noqa: E402

FRAME_END = b"\xce"
HDR = struct.Struct(">BHI")
ACK = struct.Struct(">BHIHHQB")


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiters: list = []
        self.on_deliver = lambda tag: None
        self.on_confirm = lambda tag, multiple: None
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, t) -> None:  # type: ignore[no-untyped-def]
        self.t = t

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def send(self, obj, ch: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.t.write(pframe.marshal(obj, ch))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        off, n = 0, len(buf)
        while n - off >= 7:
            ftype, _ch, size = HDR.unpack_from(buf, off)
            end = off + 7 + size
            if end + 1 > n:
                break
            if ftype == 1:
                cls, meth = struct.unpack_from(">HH", buf, off + 7)
                if cls == 60 and meth == 60:
                    p = off + 11
                    p += 1 + buf[p]
                    self.on_deliver(struct.unpack_from(">Q", buf, p)[0])
                elif cls == 60 and meth in (80, 120):
                    tag = struct.unpack_from(">Q", buf, off + 11)[0]
                    self.on_confirm(tag, buf[off + 19] & 1)
                else:
                    _, _, obj = pframe.unmarshal(bytes(buf[off : end + 1]))
                    for i, (kind, fut) in enumerate(self.waiters):
                        if isinstance(obj, kind):
                            del self.waiters[i]
                            fut.set_result(obj)
                            break
            off = end + 1
        del buf[:off]

    async def wait(self, kind):  # type: ignore[no-untyped-def]
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((kind, fut))
        return await asyncio.wait_for(fut, 10)


async def connect(port: int) -> Client:
    _, c = await asyncio.get_running_loop().create_connection(Client, "127.0.0.1", port)
    c.t.write(b"AMQP\x00\x00\x09\x01")
    await c.wait(C.Connection.Start)
    c.send(C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    tune = await c.wait(C.Connection.Tune)
    c.send(C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max))
    c.send(C.Connection.Open(virtual_host="/"))
    await c.wait(C.Connection.OpenOk)
    c.send(C.Channel.Open(), 1)
    await c.wait(C.Channel.OpenOk)
    return c


async def produce(port: int, a: argparse.Namespace, stop_at: float) -> None:
    c = await connect(port)
    state = {"seq": 0, "acked": 0}
    room = asyncio.Event()
    room.set()

    def on_confirm(tag: int, multiple: int) -> None:
        state["acked"] = tag if multiple else max(state["acked"], tag)
        if state["seq"] - state["acked"] < a.confirm:
            room.set()

    c.on_confirm = on_confirm
    if a.confirm:
        c.send(C.Confirm.Select(), 1)
        await c.wait(C.Confirm.SelectOk)
    method = pframe.marshal(C.Basic.Publish(exchange="", routing_key=a.queue), 1)
    props = C.Basic.Properties(delivery_mode=2 if a.persistent else 1)
    header = pframe.marshal(H.ContentHeader(body_size=a.size, properties=props), 1)
    body = HDR.pack(3, 1, a.size) + b"x" * a.size + FRAME_END
    one = method + header + body
    while time.time() < stop_at:
        await c.writable.wait()
        k = 50
        if a.confirm:
            k = min(k, a.confirm - (state["seq"] - state["acked"]))
            if k <= 0:
                room.clear()
                await room.wait()
                continue
        c.t.write(one * k)
        state["seq"] += k
        await asyncio.sleep(0)
    c.t.close()


async def consume(port: int, a: argparse.Namespace, stop_at: float, out) -> None:  # type: ignore[no-untyped-def]
    c = await connect(port)
    c.send(C.Basic.Qos(prefetch_count=a.prefetch), 1)
    await c.wait(C.Basic.QosOk)
    state = {"n": 0, "unacked": 0, "marks": []}
    every = max(1, a.prefetch // 4)

    def on_deliver(tag: int) -> None:
        state["n"] += 1
        state["unacked"] += 1
        if state["unacked"] >= every:
            c.t.write(ACK.pack(1, 1, 13, 60, 80, tag, 1) + FRAME_END)
            state["unacked"] = 0

    c.on_deliver = on_deliver
    c.send(C.Basic.Consume(queue=a.queue, consumer_tag="bench"), 1)
    await c.wait(C.Basic.ConsumeOk)
    while time.time() < stop_at:
        out.put((time.time(), state["n"]))
        await asyncio.sleep(0.1)
    c.t.close()


def client(role: str, port: int, a: argparse.Namespace, stop_at: float, out) -> None:  # type: ignore[no-untyped-def]
    if role == "producer":
        asyncio.run(produce(port, a, stop_at))
    else:
        asyncio.run(consume(port, a, stop_at, out))


def run_once(w, ports: tuple[int, int], a: argparse.Namespace) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One scenario: (producer port, consumer port). CPU per message in the window."""
    from workers.placing import owned

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 1.5  # the clients' start-up and warm-up
    stop_at = start + a.warmup + a.seconds
    procs = [
        ctx.Process(target=client, args=("consumer", ports[1], a, stop_at + 0.3, out)),
        ctx.Process(target=client, args=("producer", ports[0], a, stop_at, out)),
    ]
    for p in procs:
        p.start()
    begin = start + a.warmup
    marks: list[tuple[float, int]] = []
    cpu0 = n0 = t0 = None
    while time.time() < stop_at:
        while not out.empty():
            marks.append(out.get())
        if cpu0 is None and time.time() >= begin and marks:
            r = resource.getrusage(resource.RUSAGE_SELF)
            cpu0, t0, n0 = r.ru_utime + r.ru_stime, time.time(), marks[-1][1]
        time.sleep(0.05)
    r = resource.getrusage(resource.RUSAGE_SELF)
    cpu1, t1 = r.ru_utime + r.ru_stime, time.time()
    while not out.empty():
        marks.append(out.get())
    n1 = max((n for t, n in marks if t <= t1), default=0)
    for p in procs:
        p.join(15)
    w.call(lambda: owned(w, 1, a.queue).vhost.purge_queue(owned(w, 1, a.queue)))
    count = (n1 - (n0 or 0)) or 1
    return {"us_per_msg": (cpu1 - cpu0) / count * 1e6, "msgs_per_s": count / (t1 - t0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--confirm", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=500)
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's garbage-collector thresholds (a worker process tunes them)",
    )
    a = p.parse_args()

    import leveret
    from leveret.server import gc_tuning
    from workers.inprocess import in_process_workers
    from workers.placing import place

    # The garbage collector's settings of a worker process (leveret/worker.py): a
    # crossing message makes short-lived objects, which the default gen-0 threshold
    # of 700 would make this process collect far more often than a worker does.
    if not a.default_gc:
        gc_tuning.tune()
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) if a.persistent else None
        with in_process_workers(2, data_dir) as w:
            a.queue = place(w, 1, "bench.crossing", durable=a.persistent)
            scenarios = {
                "local": (w.port(1), w.port(1)),
                "publish crosses": (w.port(0), w.port(1)),
                "both cross": (w.port(0), w.port(0)),
            }
            for _ in range(a.runs):
                for name, ports in scenarios.items():
                    results.setdefault(name, []).append(run_once(w, ports, a))
    shape = (
        f"size {a.size}, {'persistent' if a.persistent else 'transient'}, "
        f"confirm {a.confirm or 'off'}, prefetch {a.prefetch}"
    )
    print(f"# {shape}; {os.cpu_count()} CPUs; loadavg {os.getloadavg()[0]:.2f}")
    print(f"# compiled: {len(leveret.build_info()['compiled'])} modules; gc {gc.get_threshold()}")
    print("| scenario | broker CPU µs/msg (median) | range | msgs/s (median) |")
    print("|---|---:|---|---:|")
    summary = {}
    for name, runs in results.items():
        us = [r["us_per_msg"] for r in runs]
        rate = [r["msgs_per_s"] for r in runs]
        summary[name] = {"us_per_msg": statistics.median(us), "msgs_per_s": statistics.median(rate)}
        print(
            f"| {name} | {statistics.median(us):.2f} | {min(us):.2f}-{max(us):.2f} "
            f"| {statistics.median(rate):,.0f} |"
        )
    print(json.dumps({"shape": shape, "results": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
