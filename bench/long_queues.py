#!/usr/bin/env python3
"""S9: many long queues at once: the broker's RSS with them full, and the time to drain.

    python bench/long_queues.py --port 5672 --pid PID [--queues 1000 --messages 10000]

Against any AMQP 0-9-1 broker (bench/compare runs it against both): declares
`--queues` durable queues, fills each with `--messages` persistent messages of
`--size` bytes (publisher confirms, `--window` unconfirmed at most, round-robin over
the queues so every queue is long at once), reads the broker's RSS from
/proc/PID/status, then consumes everything with one consumer per queue (one
connection, autoack) and times the drain. Deletes the queues at the end. Prints one
JSON line: fill msg/s, RSS idle and full (MB), drain seconds and msg/s.

The client is the protocol core (leveret.protocol.connection) on a blocking socket,
pipelined, so the broker and not the client is what is measured.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from pamqp import commands as cmd  # noqa: E402

from leveret.perf.amqp import ConfirmTracker  # noqa: E402
from leveret.protocol import connection as pc  # noqa: E402
from leveret.protocol.properties import BasicProperties  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Client:
    """One connection: the sans-IO core on a blocking socket."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # No heartbeats: this client sends nothing while it drains (autoack), and a drain
        # of 10,000,000 messages outlasts two 60 s heartbeat intervals.
        self.core = pc.Connection(pc.CLIENT, frame_max=131072, heartbeat=0)
        self.core.initiate()
        self.flush()
        while self.core.state != pc.OPEN:
            self.events()
        self.core.open_channel(1)
        self.flush()
        self.wait(lambda e: isinstance(e, pc.ChannelOpened))

    def flush(self) -> None:
        data = self.core.data_to_send()
        if data:
            self.sock.sendall(data)

    def events(self) -> list:
        data = self.sock.recv(1 << 20)
        if not data:
            raise RuntimeError("the broker closed the connection")
        out = list(self.core.receive_data(data))
        for e in out:
            if isinstance(e, pc.ConnectionClosed | pc.ChannelClosed | pc.ProtocolError):
                raise RuntimeError(f"closed by the broker: {e!r}")
        self.flush()
        return out

    def wait(self, want) -> object:  # type: ignore[no-untyped-def]
        while True:
            for e in self.events():
                if want(e):
                    return e

    def rpc(self, method: object, reply: type) -> object:
        self.core.send_method(1, method)
        self.flush()
        return self.wait(lambda e: isinstance(e, pc.MethodReceived) and isinstance(e.method, reply))

    def close(self) -> None:
        self.sock.close()


def fill(c: Client, names: list[str], messages: int, body: bytes, window: int) -> float:
    c.rpc(cmd.Confirm.Select(), cmd.Confirm.SelectOk)
    props = BasicProperties(delivery_mode=2).encode()
    total = len(names) * messages
    sent = 0
    confirms = ConfirmTracker()  # messages to many queues: single acks come out of order

    def take_confirms() -> None:
        for e in c.events():
            if isinstance(e, pc.Ack | pc.Nack):
                confirms.on_confirm(e.delivery_tag, e.multiple, isinstance(e, pc.Nack))

    started = time.monotonic()
    for _round in range(messages):
        for name in names:
            c.core.send_publish(1, "", name, body, props)
            sent += 1
            if sent % 500 == 0:
                c.flush()
                while sent - confirms.confirmed - confirms.nacked > window:
                    take_confirms()
    c.flush()
    while confirms.confirmed + confirms.nacked < total:
        take_confirms()
    if confirms.nacked:
        raise RuntimeError(f"{confirms.nacked} publishes were nacked")
    return total / (time.monotonic() - started)


def drain(c: Client, names: list[str], total: int) -> float:
    started = time.monotonic()
    for name in names:
        c.core.send_method(1, cmd.Basic.Consume(queue=name, consumer_tag=f"s9.{name}", no_ack=True))
    c.flush()
    got = 0
    while got < total:
        for e in c.events():
            if isinstance(e, pc.Deliver):
                got += 1
    return time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--pid", type=int, required=True, help="the broker's PID, for its RSS")
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--messages", type=int, default=10_000, help="per queue")
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--window", type=int, default=5000, help="unconfirmed publishes at most")
    args = p.parse_args()
    names = [f"s9.q{i}" for i in range(args.queues)]
    total = args.queues * args.messages
    idle = rss_mb(args.pid)
    c = Client(args.host, args.port)
    try:
        for name in names:
            c.rpc(cmd.Queue.Declare(queue=name, durable=True), cmd.Queue.DeclareOk)
            c.rpc(cmd.Queue.Purge(queue=name), cmd.Queue.PurgeOk)
        rate = fill(c, names, args.messages, b"x" * args.size, args.window)
        time.sleep(2)  # let the broker settle (RabbitMQ pages in the background)
        full = rss_mb(args.pid)
        c.close()
        c = Client(args.host, args.port)
        seconds = drain(c, names, total)
        after = rss_mb(args.pid)
        c.close()
        c = Client(args.host, args.port)
        for name in names:
            c.rpc(cmd.Queue.Delete(queue=name), cmd.Queue.DeleteOk)
    finally:
        c.close()
    print(json.dumps({
        "queues": args.queues, "messages_per_queue": args.messages, "size": args.size,
        "fill_per_s": round(rate), "rss_idle_mb": round(idle, 1), "rss_full_mb": round(full, 1),
        "rss_drained_mb": round(after, 1), "drain_seconds": round(seconds, 2),
        "drain_per_s": round(total / seconds),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
