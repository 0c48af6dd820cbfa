#!/usr/bin/env python3
"""The broker's hot path in one process, without sockets: work per message, repeatably.

A real node (`launcher.Node`: its model, queues, store) and real `AMQPConnection`s, fed
the bytes a client would send through an in-memory transport: a publisher connection
gets batches of basic.publish frames, a consumer connection takes the deliveries and acks them. No
load generator shares the CPU and no kernel socket work is counted, so under valgrind
the figure is the same from run to run whatever else the machine does:

    python bench/hotpath_ir.py --case S1 --messages 20000          # ns per message
    bench/hotpath_ir.py --callgrind --case S1                      # instructions per message
    LEVERET_PURE_PYTHON=1 bench/hotpath_ir.py --callgrind --case S1

With --callgrind the script runs itself twice under `valgrind --tool=callgrind`, with
the given number of messages and with none (same set-up and warm-up), and prints the
difference divided by the message count. Cases: S1 (16 B transient, manual ack,
prefetch 500), S5 (4 KB, autoack), S2 (persistent 16 B to a durable queue, confirms;
fsync never, so the writer thread's I/O is the only variable), T (16 B through a topic
exchange with 20 bindings, autoack). --function times one hot-path function alone
(the protocol core's parse of a publish or a delivery, deliver_head, ...).
`--batch 1 --ack-every 125` feeds one publish per read, as S3's 5,000 msg/s does
(the default is 250 a read).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pamqp import commands as cmd
from pamqp import frame, header

HERE = Path(__file__).resolve().parent

CASES = {
    "S1": {"size": 16, "persistent": False, "autoack": False, "exchange": ""},
    "S5": {"size": 4096, "persistent": False, "autoack": True, "exchange": ""},
    "S2": {"size": 16, "persistent": True, "autoack": False, "exchange": "", "confirm": True},
    "T": {"size": 16, "persistent": False, "autoack": True, "exchange": "bench.topic"},
}
BATCH = 250  # publishes per read, acks per batch: below prefetch 500, so nothing waits
# --batch 1 --ack-every 125 is S3's shape: one message per read, acked 125 at a time
# (as amqbench acks with prefetch 500); what a read costs beyond its messages shows.
ACK_EVERY = 0  # 0: one ack (multiple) per read
# --direct: no event-loop turns between reads; the harness calls the connections'
# flushes itself, so the count is the broker's own work for a read and its delivery
# (what S3 pays per read), without the loop's or the harness's coroutine turns.
DIRECT = False


class Transport(asyncio.Transport):
    """What AMQPConnection needs of a socket transport; output is counted, then dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []
        self.nbytes = 0
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 5672)}.get(
            name, default
        )

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))
        self.nbytes += len(data)

    def writelines(self, parts) -> None:  # type: ignore[override]
        for p in parts:
            self.write(p)

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def method(channel: int, m: object) -> bytes:
    return frame.marshal(m, channel)


async def turn() -> None:
    """Let callbacks the broker scheduled (output flushes, confirms) run."""
    for _ in range(3):
        await asyncio.sleep(0)


class Client:
    """One AMQPConnection of the node's listener, driven with raw frames."""

    def __init__(self, server: object) -> None:
        from leveret.server.connection import AMQPConnection

        self.t = Transport()
        self.conn = AMQPConnection(server)  # type: ignore[arg-type]
        self.conn.connection_made(self.t)

    def feed(self, data: bytes) -> None:
        if not DIRECT:
            self.conn.data_received(data)
            return
        # As uvloop reads for a BufferedProtocol: into the buffer the connection
        # offers, then buffer_updated (the broker's own read path, counted).
        conn = self.conn
        view = memoryview(data)
        while view:
            buf = conn.get_buffer(-1)
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            conn.buffer_updated(n)
            view = view[n:]

    async def open(self) -> None:
        self.feed(b"AMQP\x00\x00\x09\x01")
        await turn()
        self.feed(method(0, cmd.Connection.StartOk(response="\x00guest\x00guest")))
        await turn()
        self.feed(method(0, cmd.Connection.TuneOk(channel_max=2047, frame_max=131072)))
        self.feed(method(0, cmd.Connection.Open(virtual_host="/")))
        self.feed(method(1, cmd.Channel.Open()))
        await turn()
        self.t.take()


async def run(case: str, messages: int, warmup: int) -> dict[str, float]:
    from leveret.config import ServerConfig
    from leveret.launcher import Node

    spec = CASES[case]
    data_dir = tempfile.mkdtemp(prefix="leveret-hotpath-")
    config = ServerConfig(
        port=0, data_dir=data_dir, persistence=True, fsync="never",  # as `leveret server`
        management_port=None, prometheus_port=None,
    )  # fmt: skip
    server = Node(config, loop=asyncio.get_running_loop())
    await server.start()
    pub, con = Client(server.listener), Client(server.listener)
    await pub.open()
    await con.open()
    durable = spec["persistent"]
    exchange = spec["exchange"]
    setup = [method(1, cmd.Queue.Declare(queue="bench.q", durable=durable))]
    rk = "bench.q"
    if exchange:
        setup.append(method(1, cmd.Exchange.Declare(exchange=exchange, exchange_type="topic")))
        for i in range(20):
            key = "bench.#" if i == 0 else f"other.{i}.*"
            setup.append(
                method(1, cmd.Queue.Bind(queue="bench.q", exchange=exchange, routing_key=key))
            )
        rk = "bench.a.b"
    pub.feed(b"".join(setup))
    if spec.get("confirm"):
        pub.feed(method(1, cmd.Confirm.Select()))
    con.feed(method(1, cmd.Basic.Qos(prefetch_count=500)))
    con.feed(
        method(1, cmd.Basic.Consume(queue="bench.q", consumer_tag="ct", no_ack=spec["autoack"]))
    )
    await turn()
    pub.t.take()
    con.t.take()
    props = cmd.Basic.Properties(delivery_mode=2 if durable else 1)
    one = (
        method(1, cmd.Basic.Publish(exchange=exchange, routing_key=rk))
        + frame.marshal(header.ContentHeader(0, spec["size"], props), 1)
        + frame.marshal(_body(spec["size"]), 1)
    )
    batch = one * BATCH
    delivered = acked = 0

    async def step() -> None:
        nonlocal delivered, acked
        pub.feed(batch)
        if DIRECT and not spec.get("confirm"):
            con.conn._flush()
            out = con.t.take()
            got = out.count(b"\x00\x3c\x00\x3c")
            delivered += got
            if not spec["autoack"] and got and delivered - acked >= ACK_EVERY:
                con.feed(method(1, cmd.Basic.Ack(delivery_tag=delivered, multiple=True)))
                acked = delivered
            pub.conn._flush()
            pub.t.take()
            return
        await turn()
        out = con.t.take()
        got = out.count(b"\x00\x3c\x00\x3c")  # basic.deliver's class and method ids
        delivered += got
        if not spec["autoack"] and got and delivered - acked >= ACK_EVERY:
            con.feed(method(1, cmd.Basic.Ack(delivery_tag=delivered, multiple=True)))
            acked = delivered
        if spec.get("confirm"):
            await asyncio.sleep(0.001)  # the writer thread's on_durable callbacks
        await turn()
        pub.t.take()

    for _ in range(max(1, warmup // BATCH)):
        await step()
    delivered_before = delivered
    start = time.perf_counter()
    for _ in range(messages // BATCH):
        await step()
    took = time.perf_counter() - start
    got = delivered - delivered_before
    await server.stop()
    return {"messages": messages // BATCH * BATCH, "delivered": got, "seconds": took}


def micro(name: str, n: int) -> None:
    """One hot-path function `n` times (docs/performance-notes.md#the-compiled-hot-path)."""
    from leveret.protocol import connection as pc
    from leveret.protocol import methods as wire
    from leveret.protocol.properties import parse_header

    props = cmd.Basic.Properties(delivery_mode=1)
    hdr = frame.marshal(header.ContentHeader(0, 16, props), 1)
    body = frame.marshal(_body(16), 1)
    if name in ("parse_publish", "parse_deliver"):
        server = name == "parse_publish"
        m = (cmd.Basic.Publish(exchange="", routing_key="bench.q") if server else
             cmd.Basic.Deliver(consumer_tag="ct", delivery_tag=1, exchange="", routing_key="bench.q"))  # fmt: skip
        batch = (frame.marshal(m, 1) + hdr + body) * BATCH
        conn = _open_core(pc, server)
        for _ in range(n // BATCH):
            for _event in conn.receive_data(batch):
                pass
        return
    if name == "deliver_head":
        prefix, names, h = wire.deliver_prefix("ct"), wire.short_strings("", "bench.q"), hdr[7:-1]
        for i in range(n):
            wire.deliver_head(1, prefix, i, False, names, h, 16)
        return
    if name == "parse_header":
        h = hdr[7:-1]
        for _ in range(n):
            parse_header(h)
        return
    if name == "decode_ack":
        payload = frame.marshal(cmd.Basic.Ack(delivery_tag=12345, multiple=True), 1)[7:-1]
        for _ in range(n):
            wire.decode_ack(payload)
        return
    raise SystemExit(f"unknown function {name}")


MICRO = ("parse_publish", "parse_deliver", "deliver_head", "parse_header", "decode_ack")


def _open_core(pc, server_role: bool):  # type: ignore[no-untyped-def]
    client = pc.Connection(pc.CLIENT)
    server = pc.Connection(pc.SERVER)
    client.initiate()
    for _ in range(10):
        for ev in list(server.receive_data(client.data_to_send())):
            if isinstance(ev, pc.StartOkReceived):
                server.accept_login()
            elif isinstance(ev, pc.OpenRequested):
                server.accept_open()
        list(client.receive_data(server.data_to_send()))
    conn = server if server_role else client
    if server_role:
        list(server.receive_data(frame.marshal(cmd.Channel.Open(), 1)))
    else:
        client.open_channel(1)
        list(client.receive_data(frame.marshal(cmd.Channel.OpenOk(), 1)))
    conn.data_to_send()
    return conn


def _body(size: int):
    from pamqp.body import ContentBody

    return ContentBody(b"x" * size)


def callgrind(case: str, messages: int, warmup: int, function: str = "") -> dict[str, object]:
    """Instructions per message (or call): the run with `messages` minus the one with none."""
    counts = []
    for n in (messages, 0):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cg.out")
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, __file__, "--case", case, "--messages", str(n),
                    "--warmup", str(warmup), "--json", "--batch", str(BATCH),
                    "--ack-every", str(ACK_EVERY)] + (["--direct"] if DIRECT else [])  # fmt: skip
            if function:
                argv += ["--function", function]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            if res.returncode:
                raise SystemExit(f"valgrind run failed: {res.stderr[-2000:]}")
            text = Path(out).read_text(errors="replace")
            m = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
            counts.append(int(m.group(1)))
            if n:
                detail = json.loads(res.stdout.strip().splitlines()[-1])
    per = (counts[0] - counts[1]) / max(1, detail["messages"])
    what = {"function": function} if function else {"case": case}
    return {**what, "instructions_per_message": round(per), **detail, **_build()}


def _build() -> dict[str, object]:
    import leveret

    info = getattr(leveret, "build_info", None)
    return {"build": info() if info else {"compiled": []}}


def main() -> int:
    global BATCH, ACK_EVERY, DIRECT
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--case", default="S1", choices=sorted(CASES))
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--callgrind", action="store_true", help="instructions per message")
    p.add_argument("--json", action="store_true")
    p.add_argument("--function", choices=MICRO, help="one hot-path function alone, in a loop")
    p.add_argument("--batch", type=int, default=BATCH, help="publishes per read (250)")
    p.add_argument("--ack-every", type=int, default=0, help="ack once this many are delivered")
    p.add_argument("--direct", action="store_true",
                   help="no loop turns, reads through get_buffer/buffer_updated as uvloop's: "
                        "the broker's own work a read (not with S2)")  # fmt: skip
    args = p.parse_args()
    BATCH, ACK_EVERY, DIRECT = max(1, args.batch), args.ack_every, args.direct
    if args.callgrind:
        print(json.dumps(callgrind(args.case, args.messages, args.warmup, args.function or "")))
        return 0
    if args.function:
        n = args.messages // BATCH * BATCH
        start = time.perf_counter()
        micro(args.function, n)
        took = time.perf_counter() - start
        if args.json:
            print(json.dumps({"messages": n, "seconds": took}))
        else:
            print(f"{args.function}: {took / max(1, n) * 1e9:,.0f} ns a call; {_build()['build']}")
        return 0
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(run(args.case, args.messages, args.warmup))
    if args.json:
        print(json.dumps(result))
    else:
        per = result["seconds"] / max(1, result["messages"]) * 1e9
        print(f"{args.case}: {result['messages']} messages, {result['delivered']} delivered, "
              f"{per:,.0f} ns a message; {_build()['build']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
