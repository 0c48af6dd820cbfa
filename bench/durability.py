"""Durability figures for Leveret, each against a fresh `leveret server` subprocess.

    python bench/durability.py [--messages 1000000] [--size 1024] [--port 5699]
                               [--fsync batch] [--duration 10] [--skip-throughput]
                               [--max-memory-bytes N] [--workdir DIR] [--kill]

(a) persistent 16 B publishes with confirms (window 1000), msgs/s, measured by
    `python -m leveret perf --persistent --confirm 1000 --duration D --json`
    (and by /work/shared/tools/amqbench.py as a referee when it is there);
(b) start-up time with --messages persistent messages of --size bytes queued:
    publish them, SIGTERM, restart, time until the port accepts connections, time
    until a passive queue.declare sent right then is answered (the broker holds it
    until the messages are back: fully recovered), and its "recovered ..." log line;
(c) RSS with those messages queued: after publishing, and after the restart.
With --kill, (b) and (c) once more after a SIGKILL: no clean-shutdown index, so the
start scans the log.

Prints one line per figure and a JSON summary at the end. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pamqp import commands, frame, header

# The team's shared tools live beside the repository: ../shared/tools.
AMQBENCH = str(Path(__file__).resolve().parents[2] / "shared" / "tools" / "amqbench.py")
FRAME_HEAD = struct.Struct(">BHI")


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


class Server:
    def __init__(
        self, port: int, data_dir: str, log_path: str, fsync: str, extra: tuple = ()
    ) -> None:
        self.extra = [str(x) for x in extra]
        self.port = port
        self.data_dir = data_dir
        self.log_path = log_path
        self.fsync = fsync
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "leveret",
            "server",
            "--workers",
            "1",
            "--port",
            str(self.port),
            "--data-dir",
            self.data_dir,
            "--fsync",
            self.fsync,
            *self.extra,
        ]

    def start(self, timeout: float = 600.0) -> float:
        """Start; return seconds until the port accepts a TCP connection."""
        self.log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        cmd = self.command()
        started = self.started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited with {self.proc.returncode}:\n{self.run_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return time.monotonic() - started
            except OSError:
                if time.monotonic() - started > timeout:
                    self.kill()
                    raise SystemExit(f"server did not listen within {timeout} s") from None
                time.sleep(0.01)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(300)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def run_log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            f.seek(self.log_offset)
            return f.read()


# ---- a minimal raw AMQP publisher (pipelined, confirms) ----------------------------------


class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.wait(commands.Connection.Start)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"publisher_confirms": True}},
                mechanism="PLAIN",
                response="\0guest\0guest",
            ),
        )
        tune = self.wait(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.wait(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.wait(commands.Channel.OpenOk)

    def send(self, channel: int, obj) -> None:
        self.sock.sendall(frame.marshal(obj, channel))

    def read(self):
        while True:
            if len(self.buf) >= 7:
                _t, _c, size = FRAME_HEAD.unpack_from(self.buf)
                if len(self.buf) >= size + 8:
                    raw = bytes(self.buf[: size + 8])
                    del self.buf[: size + 8]
                    return frame.unmarshal(raw)[2]
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk

    def wait(self, kind):
        while True:
            obj = self.read()
            if isinstance(obj, kind):
                return obj
            if isinstance(obj, commands.Connection.Close | commands.Channel.Close):
                raise RuntimeError(f"closed: {obj.reply_code} {obj.reply_text}")

    def close(self) -> None:
        try:
            self.send(0, commands.Connection.Close(200, "bye", 0, 0))
            self.wait(commands.Connection.CloseOk)
        except (OSError, RuntimeError):
            pass
        self.sock.close()


def recovered(server: Server, queue: str) -> tuple[float, int]:
    """Seconds from the start until a passive queue.declare is answered, and its count.

    The broker listens before its stored messages are back and holds the declare
    until they are: this is the time to fully recovered, as a client sees it."""
    raw = Raw(server.port)
    raw.send(1, commands.Queue.Declare(queue=queue, passive=True))
    ok = raw.wait(commands.Queue.DeclareOk)
    seconds = time.monotonic() - server.started
    raw.close()
    return seconds, ok.message_count


def publish_persistent(port: int, queue: str, count: int, size: int, window: int = 5000) -> float:
    """Declare a durable queue and fill it; returns msgs/s (first publish to last confirm)."""
    c = Raw(port)
    c.send(1, commands.Queue.Declare(queue=queue, durable=True))
    c.wait(commands.Queue.DeclareOk)
    c.send(1, commands.Confirm.Select())
    c.wait(commands.Confirm.SelectOk)
    one = (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        + frame.marshal(
            header.ContentHeader(0, size, commands.Basic.Properties(delivery_mode=2)), 1
        )
        + FRAME_HEAD.pack(3, 1, size)
        + b"x" * size
        + b"\xce"
    )
    batch = 500
    started = time.monotonic()
    sent = acked = 0
    while sent < count:
        n = min(batch, count - sent)
        c.sock.sendall(one * n)
        sent += n
        while sent - acked > window:
            acked = _confirm(c.read(), acked)
    while acked < count:
        acked = _confirm(c.read(), acked)
    elapsed = time.monotonic() - started
    c.close()
    return count / elapsed


def _confirm(obj, acked: int) -> int:
    if isinstance(obj, commands.Basic.Ack):
        return obj.delivery_tag if obj.multiple else acked + 1
    if isinstance(obj, commands.Basic.Nack):
        raise RuntimeError(f"nacked: {obj}")
    if isinstance(obj, commands.Connection.Close | commands.Channel.Close):
        raise RuntimeError(f"closed: {obj.reply_code} {obj.reply_text}")
    return acked


# ---- the figures -------------------------------------------------------------------------


def _json_line(stdout: str) -> dict | None:
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def throughput(args, workdir: str) -> dict:
    """(a): each tool against its own fresh broker."""
    out: dict = {}
    uri = f"amqp://guest:guest@127.0.0.1:{args.port}/%2F"
    tools = {
        "perf": [
            sys.executable,
            "-m",
            "leveret",
            "perf",
            "--uri",
            uri,
            "--producers",
            "1",
            "--consumers",
            "0",
            "--size",
            "16",
            "--persistent",
            "--confirm",
            "1000",
            "--duration",
            str(args.duration),
            "--json",
            "--quiet",
        ],
    }
    if os.path.exists(AMQBENCH):
        tools["amqbench"] = [
            sys.executable,
            AMQBENCH,
            "--port",
            str(args.port),
            "--persistent",
            "--confirm",
            "1000",
            "--size",
            "16",
            "--consumers",
            "0",
            "--seconds",
            str(int(args.duration)),
        ]
    for name, cmd in tools.items():
        server = Server(
            args.port,
            os.path.join(workdir, f"a-{name}-data"),
            os.path.join(workdir, f"a-{name}.log"),
            args.fsync,
        )
        server.start()
        try:
            print("(a) $", " ".join(cmd), flush=True)
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120)
        finally:
            rc = server.stop()
        result = _json_line(res.stdout)
        if result is None:
            print(f"(a) {name} failed ({res.returncode}): {res.stderr[-800:]}")
            continue
        rate = result.get("confirmed_per_s")
        print(
            f"(a) {name}: persistent 16 B, confirm window 1000: "
            f"{rate:,.0f} confirmed msgs/s, "
            f"{result.get('published_per_s', 0):,.0f} published/s, "
            f"nacked {result.get('nacked')}, errors {result.get('errors')}; "
            f"server exit {rc}"
        )
        out[f"a_{name}_confirmed_per_s"] = rate
    return out


def startup_and_rss(args, workdir: str) -> dict:
    extra = ("--max-memory-bytes", args.max_memory_bytes) if args.max_memory_bytes else ()
    server = Server(
        args.port,
        os.path.join(workdir, "b-data"),
        os.path.join(workdir, "b.log"),
        args.fsync,
        extra,
    )
    server.start()
    assert server.proc is not None
    time.sleep(0.5)
    base = rss_kb(server.proc.pid)
    print(f"(b,c) $ {' '.join(server.command())}")
    print(f"(b,c) publishing {args.messages:,} x {args.size} B persistent messages ...", flush=True)
    rate = publish_persistent(args.port, "bench.durable", args.messages, args.size)
    time.sleep(2)
    rss_queued = rss_kb(server.proc.pid)
    peak = rss_kb(server.proc.pid, "VmHWM")
    disk = sum(e.stat().st_size for e in os.scandir(os.path.join(server.data_dir, "msgs")))
    print(
        f"(c) RSS with {args.messages:,} x {args.size} B queued: {rss_queued / 1024:.0f} MB "
        f"(idle broker {base / 1024:.0f} MB, growth {(rss_queued - base) / 1024:.0f} MB, "
        f"peak {peak / 1024:.0f} MB); {disk / 1e6:.0f} MB on disk; "
        f"filled at {rate:,.0f} msgs/s"
    )
    t0 = time.monotonic()
    rc = server.stop()
    stop_s = time.monotonic() - t0
    print(f"(b) SIGTERM -> exit {rc} in {stop_s:.2f} s")
    startup = server.start()
    ready, count = recovered(server, "bench.durable")
    m = re.search(r"recovered (\d+) messages in ([\d.]+) s", server.run_log())
    recovered_line = m.group(0) if m else None
    time.sleep(1)
    rss_after = rss_kb(server.proc.pid)
    print(
        f"(b) start-up with {args.messages:,} queued: port open after {startup:.2f} s; "
        f"queue.declare answered ({count:,} messages) after {ready:.2f} s; "
        f"log: {recovered_line!r}"
    )
    print(f"(c) RSS after recovering them: {rss_after / 1024:.0f} MB")
    crash: dict = {}
    if args.kill:
        # A crash leaves no clean-shutdown index: the next start scans the log.
        server.kill()
        startup_k = server.start()
        ready_k, count_k = recovered(server, "bench.durable")
        m_k = re.search(r"recovered \d+ messages in ([\d.]+) s", server.run_log())
        time.sleep(1)
        rss_k = rss_kb(server.proc.pid)
        print(
            f"(b) after SIGKILL: port open after {startup_k:.2f} s; queue.declare answered "
            f"({count_k:,} messages) after {ready_k:.2f} s; "
            f"log: {m_k.group(0) if m_k else None!r}; RSS {rss_k / 1024:.0f} MB"
        )
        crash = {
            "b_startup_after_kill_s": round(startup_k, 3),
            "b_recovered_after_kill_s": round(ready_k, 3),
            "b_recovered_after_kill_messages": count_k,
            "b_recovery_after_kill_s_logged": float(m_k.group(1)) if m_k else None,
            "c_rss_after_kill_recovery_mb": round(rss_k / 1024, 1),
        }
    rc2 = server.stop()
    return {
        **crash,
        "b_startup_s": round(startup, 3),
        "b_recovered_s": round(ready, 3),
        "b_recovered_messages": count,
        "b_recovered_line": recovered_line,
        "b_recovery_s_logged": float(m.group(2)) if m else None,
        "b_sigterm_exit": rc,
        "b_sigterm_s": round(stop_s, 2),
        "c_rss_idle_mb": round(base / 1024, 1),
        "c_rss_queued_mb": round(rss_queued / 1024, 1),
        "c_rss_peak_mb": round(peak / 1024, 1),
        "c_rss_after_recovery_mb": round(rss_after / 1024, 1),
        "c_disk_mb": round(disk / 1e6, 1),
        "fill_publish_per_s": round(rate),
        "second_exit": rc2,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages",
        type=int,
        default=1_000_000,
        help="messages queued for (b) and (c) (default 1,000,000)",
    )
    parser.add_argument(
        "--size", type=int, default=1024, help="body size for (b) and (c), bytes (default 1024)"
    )
    parser.add_argument("--port", type=int, default=5699, help="port for the broker")
    parser.add_argument("--fsync", default="batch", choices=["always", "batch", "never"])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds for (a)")
    parser.add_argument(
        "--max-memory-bytes",
        type=int,
        default=None,
        help="passed to the broker for (b) and (c) (default: its own default)",
    )
    parser.add_argument("--skip-throughput", action="store_true", help="skip (a)")
    parser.add_argument(
        "--kill", action="store_true", help="(b) also: SIGKILL, then time the start that scans"
    )
    parser.add_argument("--workdir", help="keep data dirs and logs here (default: temp, removed)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="leveret-bench-")
    os.makedirs(workdir, exist_ok=True)
    summary: dict = {
        "messages": args.messages,
        "size": args.size,
        "fsync": args.fsync,
        "max_memory_bytes": args.max_memory_bytes,
    }
    try:
        if not args.skip_throughput:
            summary.update(throughput(args, workdir))
        summary.update(startup_and_rss(args, workdir))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
