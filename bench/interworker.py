#!/usr/bin/env python3
"""What moving work between worker processes costs: messages, and new connections.

    python bench/interworker.py [--seconds 1.5] [--runs 5] [--sizes 100,1024]
                                [--batch 64] [--only transfer|accept]

**Transfer**: one process sends publish records (`leveret.workers.link`'s framing,
each record `size` bytes in all) for `--seconds`, another decodes them with a
`LinkReader`, over:

- `socketpair, unbatched`: an AF_UNIX stream socket pair, one `send` per record;
- `socketpair, batched`: the same, one `send` per `--batch` records;
- `shm ring, batched`: `leveret.workers.ring` (shared memory, eventfd wakeups),
  one ring write per batch;
- `Link (asyncio), batched`: the socket pair through `leveret.workers.link.Link` at
  both ends, each in an asyncio loop, `--batch` records a loop turn (what a worker
  runs);
- `..., bytes only`: the batched socket pair and ring again, with the batch encoded
  once and the receiver counting bytes instead of decoding: the transport's own
  cost, without the framing's.

The figures are messages a second (the receiver's count over its wall time) and the
CPU time per message of both processes together (user + system, from
`resource.getrusage` in each), which is what a transport takes from the broker's
cores; on a shared machine it is steadier than the rate.

**Accept**: client processes open TCP connections as fast as they can (connect,
wait for the server's one byte, close with a reset), for `--seconds`, against:

- `SO_REUSEPORT x2`: two worker processes, each with its own listening socket on
  the same port; the kernel spreads connections between them;
- `acceptor + SCM_RIGHTS x2`: one acceptor process accepts and passes each socket to
  one of two workers in turn (`leveret.workers.handoff`).

Figures: connections a second, and the server side's CPU time per connection (the
workers', plus the acceptor's). Each figure is the median of `--runs` runs, the
scenarios taking turns within each round; the range of the single runs follows it.
Prints the machine, the load average before and after, a Markdown table and one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from leveret.workers import handoff, link  # noqa: E402
from leveret.workers.link import LinkReader, LinkWriter, Meta, Publish  # noqa: E402
from leveret.workers.ring import Ring  # noqa: E402

FORK = multiprocessing.get_context("fork")
END = 2**63
QUEUE = "q-bench"
OVERHEAD = link.HEADER.size + 9 + len("/") + 2 + 1 + len(QUEUE)  # a publish record's frame


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


# -- transfer ----------------------------------------------------------------------------


def _producer(kind: str, end, size: int, batch: int, seconds: float, start, out) -> None:
    message = bytes(size - OVERHEAD)
    w = LinkWriter()
    start.wait()
    c0 = cpu()
    deadline = time.monotonic() + seconds
    sent = 0
    if kind == "socketpair, unbatched":
        while time.monotonic() < deadline:
            for _ in range(batch):  # the clock is read once a batch, as in the others
                w.publish(sent, "/", (QUEUE,), message)
                end.sendall(w.data_to_send())
                sent += 1
        w.add(Meta(END, b""))
        end.sendall(w.data_to_send())
    elif kind == "socketpair, batched":
        while time.monotonic() < deadline:
            for _ in range(batch):
                w.publish(sent, "/", (QUEUE,), message)
                sent += 1
            end.sendall(w.data_to_send())
        w.add(Meta(END, b""))
        end.sendall(w.data_to_send())
    elif kind.endswith("bytes only"):
        for _ in range(batch):
            w.publish(0, "/", (QUEUE,), message)
        blob = w.data_to_send()  # encoded once: what is measured is the transport alone
        send = end.write if kind.startswith("shm") else end.sendall
        while time.monotonic() < deadline:
            send(blob)
            sent += batch
        w.add(Meta(END, b""))
        send(w.data_to_send())
    elif kind == "shm ring, batched":
        while time.monotonic() < deadline:
            for _ in range(batch):
                w.publish(sent, "/", (QUEUE,), message)
                sent += 1
            end.write(w.data_to_send())
        w.add(Meta(END, b""))
        end.write(w.data_to_send())
    else:  # the asyncio Link

        async def main() -> int:
            lk = await link.open_link(end, lambda records: None)
            n = 0
            while time.monotonic() < deadline:
                for _ in range(batch):
                    lk.publish(n, "/", (QUEUE,), message)
                    n += 1
                await asyncio.sleep(0)  # the loop turn ends: its records leave in one write
                await lk.drain()
            lk.send(Meta(END, b""))
            lk.flush()
            while lk.buffered:
                await asyncio.sleep(0.001)
            return n

        sent = asyncio.run(main())
    out.send({"sent": sent, "cpu": cpu() - c0})


def _consumer(kind: str, end, size: int, start, out) -> None:
    reader = LinkReader()
    start.wait()
    c0 = cpu()
    count = 0
    t0: float | None = None
    if kind == "Link (asyncio), batched":

        async def main() -> tuple[int, float]:
            done = asyncio.get_running_loop().create_future()
            n = 0
            first = 0.0

            def on_records(records: list[link.Record]) -> None:
                nonlocal n, first
                if not first:
                    first = time.monotonic()
                last = records[-1]
                n += len(records)
                if isinstance(last, Meta) and last.seq == END:
                    n -= 1
                    done.set_result(None)

            await link.open_link(end, on_records)
            await done
            return n, first

        count, t0 = asyncio.run(main())
    elif kind.endswith("bytes only"):
        # no decoding: count bytes, and watch the stream's last bytes for the END record
        w = LinkWriter()
        w.add(Meta(END, b""))
        marker = w.data_to_send()
        read = end.read if kind.startswith("shm") else lambda: end.recv(1 << 18)
        total = 0
        tail = b""
        while True:
            data = read()
            if t0 is None:
                t0 = time.monotonic()
            if not data:
                break
            total += len(data)
            tail = (tail + data[-len(marker) :])[-len(marker) :]
            if tail == marker:
                break
        count = (total - len(marker)) // size
    else:
        read = end.read if kind.startswith("shm") else lambda: end.recv(1 << 18)
        finished = False
        while not finished:
            data = read()
            if t0 is None:
                t0 = time.monotonic()
            if not data:
                break
            for r in reader.feed(data):
                if isinstance(r, Publish):
                    count += 1
                elif isinstance(r, Meta) and r.seq == END:
                    finished = True
    wall = time.monotonic() - (t0 or time.monotonic())
    out.send({"received": count, "cpu": cpu() - c0, "wall": wall})


def transfer_run(kind: str, size: int, batch: int, seconds: float) -> dict[str, float]:
    start = FORK.Barrier(2)
    p_out, p_in = FORK.Pipe(duplex=False)
    c_out, c_in = FORK.Pipe(duplex=False)
    ring: Ring | None = None
    if kind.startswith("shm"):
        ring = Ring.create(1 << 20)
        ends = (ring, ring)
    else:
        ends = link.socket_pair()
    producer = FORK.Process(
        target=_producer, args=(kind, ends[0], size, batch, seconds, start, p_in)
    )
    consumer = FORK.Process(target=_consumer, args=(kind, ends[1], size, start, c_in))
    producer.start()
    consumer.start()
    prod = p_out.recv()
    cons = c_out.recv()
    producer.join()
    consumer.join()
    if ring is not None:
        ring.close()
        ring.unlink()
    else:
        for s in ends:
            s.close()
    assert cons["received"] == prod["sent"], (kind, prod, cons)
    n = cons["received"]
    return {
        "msg_s": n / cons["wall"],
        "cpu_us": (prod["cpu"] + cons["cpu"]) / n * 1e6,
        "sender_us": prod["cpu"] / n * 1e6,
        "receiver_us": cons["cpu"] / n * 1e6,
    }


# -- accept ------------------------------------------------------------------------------


def _serve_listener(listener: socket.socket, stop, out) -> None:
    """A worker with its own listening socket (SO_REUSEPORT)."""
    listener.settimeout(0.05)
    c0 = cpu()
    n = 0
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            conn.sendall(b"x")
        except OSError:
            pass
        conn.close()
        n += 1
    out.send({"accepted": n, "cpu": cpu() - c0})


def _serve_handed(channel: socket.socket, out, others: list[socket.socket]) -> None:
    """A worker given its connections by the acceptor."""
    for s in others:  # inherited from the parent: the channels' ends that are not ours
        s.close()  # (an acceptor's end open here would keep our channel from its end)
    c0 = cpu()
    n = 0
    while (got := handoff.recv_connection(channel)) is not None:
        conn, _state = got
        try:
            conn.sendall(b"x")
        except OSError:
            pass
        conn.close()
        n += 1
    out.send({"accepted": n, "cpu": cpu() - c0})


def _acceptor(listener: socket.socket, channels: list[socket.socket], stop, out) -> None:
    listener.settimeout(0.05)
    c0 = cpu()
    n = 0
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        handoff.send_connection(channels[n % len(channels)], conn)
        conn.close()
        n += 1
    for ch in channels:
        ch.close()
    out.send({"accepted": n, "cpu": cpu() - c0})


def _client(address: tuple[str, int], seconds: float, start, out) -> None:
    start.wait()
    deadline = time.monotonic() + seconds
    n = 0
    c0 = cpu()
    linger = (1).to_bytes(4, "little") + (0).to_bytes(4, "little")  # close with a reset:
    # no TIME_WAIT left behind, so thousands of runs do not use up the local ports
    while time.monotonic() < deadline:
        s = socket.create_connection(address)
        s.recv(1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        s.close()
        n += 1
    out.send({"connections": n, "cpu": cpu() - c0})


def accept_run(kind: str, clients: int, seconds: float) -> dict[str, float]:
    stop = FORK.Event()
    start = FORK.Barrier(clients)
    servers = []
    pipes = []
    closers: list[socket.socket] = []
    if kind == "SO_REUSEPORT x2":
        listeners = []
        port = 0
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", port))
            port = s.getsockname()[1]
            s.listen(1024)
            listeners.append(s)
        for s in listeners:
            r, w = FORK.Pipe(duplex=False)
            servers.append(FORK.Process(target=_serve_listener, args=(s, stop, w)))
            pipes.append(r)
        closers = listeners
    else:
        listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        port = listener.getsockname()[1]
        mine, theirs = zip(*(handoff.channel_pair() for _ in range(2)), strict=True)
        for ch in theirs:
            r, w = FORK.Pipe(duplex=False)
            others = [listener, *mine, *(x for x in theirs if x is not ch)]
            servers.append(FORK.Process(target=_serve_handed, args=(ch, w, others)))
            pipes.append(r)
        r, w = FORK.Pipe(duplex=False)
        servers.append(FORK.Process(target=_acceptor, args=(listener, list(mine), stop, w)))
        pipes.append(r)
        closers = [listener, *mine, *theirs]
    for p in servers:
        p.start()
    for s in closers:
        s.close()
    client_pipes = []
    client_procs = []
    for _ in range(clients):
        r, w = FORK.Pipe(duplex=False)
        p = FORK.Process(target=_client, args=(("127.0.0.1", port), seconds, start, w))
        p.start()
        client_procs.append(p)
        client_pipes.append(r)
    client_results = [r.recv() for r in client_pipes]
    for p in client_procs:
        p.join()
    stop.set()
    server_results = [r.recv() for r in pipes]
    for p in servers:
        p.join()
    connections = sum(c["connections"] for c in client_results)
    served = [s["accepted"] for s in server_results]
    worker_counts = served[:2]
    assert sum(worker_counts) == connections, (kind, served, connections)
    server_cpu = sum(s["cpu"] for s in server_results)
    return {
        "conn_s": connections / seconds,
        "cpu_us": server_cpu / connections * 1e6,
        "client_us": sum(c["cpu"] for c in client_results) / connections * 1e6,
        "share": min(worker_counts) / max(sum(worker_counts), 1),
    }


# -- reporting ---------------------------------------------------------------------------


def summarise(runs: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    return {
        key: (
            statistics.median(r[key] for r in runs),
            min(r[key] for r in runs),
            max(r[key] for r in runs),
        )
        for key in runs[0]
    }


def fmt(value: tuple[float, float, float], digits: int = 0) -> str:
    med, lo, hi = value
    return f"{med:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


TRANSPORTS = (
    "socketpair, unbatched",
    "socketpair, batched",
    "shm ring, batched",
    "Link (asyncio), batched",
    "socketpair, batched, bytes only",
    "shm ring, batched, bytes only",
)
ACCEPTS = ("SO_REUSEPORT x2", "acceptor + SCM_RIGHTS x2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one run")
    parser.add_argument("--runs", type=int, default=5, help="runs of each scenario")
    parser.add_argument("--sizes", default="100,1024", help="record sizes, bytes")
    parser.add_argument("--batch", type=int, default=64, help="records a batch")
    parser.add_argument("--clients", type=int, default=2, help="client processes (accept)")
    parser.add_argument("--only", choices=("transfer", "accept"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if min(sizes) <= OVERHEAD:
        parser.error(f"a record is at least {OVERHEAD + 1} bytes")
    load_before = os.getloadavg()
    print(f"machine: {machine()}")
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    result: dict[str, object] = {"machine": machine(), "load_before": load_before}

    if args.only != "accept":
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.runs):
            for size in sizes:
                for kind in TRANSPORTS:
                    runs.setdefault((kind, size), []).append(
                        transfer_run(kind, size, args.batch, args.seconds)
                    )
        print()
        print(
            f"Transfer: {args.seconds} s runs, median of {args.runs} (range), "
            f"batches of {args.batch} records"
        )
        print()
        print("| transport | record | msg/s | CPU µs/msg (both) | sender µs | receiver µs |")
        print("|---|---:|---:|---:|---:|---:|")
        table = []
        for (kind, size), rs in runs.items():
            s = summarise(rs)
            print(
                f"| {kind} | {size} B | {fmt(s['msg_s'])} | {fmt(s['cpu_us'], 2)} | "
                f"{s['sender_us'][0]:.2f} | {s['receiver_us'][0]:.2f} |"
            )
            table.append({"transport": kind, "size": size, **s})
        result["transfer"] = table

    if args.only != "transfer":
        aruns: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.runs):
            for kind in ACCEPTS:
                aruns.setdefault(kind, []).append(accept_run(kind, args.clients, args.seconds))
        print()
        print(
            f"Accept: {args.clients} client processes, {args.seconds} s runs, "
            f"median of {args.runs} (range)"
        )
        print()
        print(
            "| accept | connections/s | server CPU µs/conn | client µs/conn | fewer worker's share |"
        )
        print("|---|---:|---:|---:|---:|")
        atable = []
        for kind, rs in aruns.items():
            s = summarise(rs)
            print(
                f"| {kind} | {fmt(s['conn_s'])} | {fmt(s['cpu_us'], 1)} | "
                f"{s['client_us'][0]:.1f} | {s['share'][0]:.2f} |"
            )
            atable.append({"accept": kind, **s})
        result["accept"] = atable

    load_after = os.getloadavg()
    result["load_after"] = load_after
    print()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
