"""Helpers for bench/compare: broker processes, scenario runs, result tables.

Kept apart from the executable so the pieces can be imported and reused (e.g. to run a
single scenario from a Python shell while the broker is being tuned).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED_TOOLS = REPO.parent / "shared" / "tools"


def log(message: str) -> None:
    """Progress goes to stderr so stdout carries only the Markdown result."""
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def raise_fd_limit() -> None:
    """1000 idle connections (S6) need more descriptors than the usual soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def tail(text: str, lines: int = 5) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


@dataclass
class Broker:
    name: str
    port: int
    pid: int | None = None
    error: str | None = None
    process: subprocess.Popen[bytes] | None = None
    data_dir: str | None = None
    log_path: str | None = None

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def stop(self) -> None:
        """Stop only a broker this script started (the reference RabbitMQ is shared)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


@contextlib.contextmanager
def others_paused(
    brokers: dict[str, Broker], measured: str, enabled: bool = True, settle: float = 1.0
) -> Iterator[None]:
    """Stop (SIGSTOP) every broker but `measured` while it is measured, then resume them.

    An idle broker still runs timers (the reference RabbitMQ used 0.5% of a core when
    idle here, statistics collection among it). On two cores that lands in the other
    broker's latency (Leveret's S3 p99, three runs each: 0.32-0.45 ms with RabbitMQ idle beside
    it, 0.28-0.31 ms with RabbitMQ shut down; RabbitMQ's own p99 did not move with an
    idle Leveret beside it). So each broker runs alone.
    """
    paused: list[int] = []
    try:
        if enabled:
            for key, broker in brokers.items():
                if key != measured and broker.pid and not broker.error:
                    try:
                        os.kill(broker.pid, signal.SIGSTOP)
                        paused.append(broker.pid)
                    except ProcessLookupError:
                        pass
        if paused:
            # The measured broker was itself resumed a moment ago: let its timers catch up.
            time.sleep(settle)
        yield
    finally:
        for pid in paused:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def start_leveret(port: int, command: str, python: str, wait: float = 30.0) -> Broker:
    """Start `python -m leveret server` on a fresh data dir and wait for its port."""
    broker = Broker("Leveret", port)
    if port_open(port):
        broker.error = f"port {port} is already in use; stop that process or pass --leveret-port"
        return broker
    broker.data_dir = tempfile.mkdtemp(prefix="leveret-compare-")
    broker.log_path = os.path.join(broker.data_dir, "server.log")
    argv = command.format(python=python, port=port, data_dir=broker.data_dir).split()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    log(f"starting Leveret: {' '.join(argv)}")
    with open(broker.log_path, "wb") as out:
        broker.process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=raise_fd_limit
        )
    broker.pid = broker.process.pid
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            broker.error = (
                f"Leveret exited with status {broker.process.returncode}: "
                f"{tail(Path(broker.log_path).read_text(errors='replace'))}"
            )
            return broker
        if port_open(port):
            return broker
        time.sleep(0.2)
    broker.error = (
        f"Leveret did not listen on port {port} within {wait:g} s (log {broker.log_path})"
    )
    return broker


def find_rabbitmq_pid(port: int) -> int | None:
    """The beam.smp PID: by node name if visible, else by who listens on the port."""
    found = subprocess.run(
        ["pgrep", "-f", "beam.smp.*refrabbit"], capture_output=True, text=True, check=False
    ).stdout.split()
    if found:
        return int(found[0])
    if shutil.which("ss"):
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
        match = re.search(r"pid=(\d+)", out)
        if match:
            return int(match.group(1))
    found = subprocess.run(
        ["pgrep", "-f", "beam.smp"], capture_output=True, text=True, check=False
    ).stdout.split()
    return int(found[0]) if len(found) == 1 else None


def start_rabbitmq(port: int, script: Path, pid: int | None) -> Broker:
    """Use the reference RabbitMQ, starting it with its helper script if it is down."""
    broker = Broker("RabbitMQ", port)
    if not port_open(port):
        if not script.exists():
            broker.error = f"RabbitMQ is not on port {port} and {script} does not exist"
            return broker
        log(f"starting RabbitMQ: bash {script} start {port}")
        res = subprocess.run(
            ["bash", str(script), "start", str(port)], capture_output=True, text=True, check=False
        )
        if res.returncode != 0 or not port_open(port):
            broker.error = f"RabbitMQ did not start: {tail(res.stdout + res.stderr)}"
            return broker
    broker.pid = pid or find_rabbitmq_pid(port)
    if broker.pid is None:
        log("warning: cannot find the RabbitMQ beam.smp PID; pass --rabbitmq-pid for S6/S7")
    return broker


@dataclass
class Scenario:
    key: str
    title: str
    flags: list[str]
    figure: str  # "consumed" | "confirmed" | "latency"
    perf_extra: list[str] = field(default_factory=list)
    # The tools that can run it (amqbench has one queue per fanout branch only).
    tools: tuple[str, ...] = ("amqbench", "leveret perf")


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in [
        Scenario(
            "S1",
            "transient 16 B, 1 producer/1 consumer, manual ack, prefetch 500: msg/s consumed",
            ["--size", "16", "--prefetch", "500"],
            "consumed",
        ),
        Scenario(
            "S2",
            "persistent, confirm window 1000: confirmed/s",
            ["--persistent", "--confirm", "1000"],
            "confirmed",
        ),
        Scenario("S3", "rate 5000 msg/s: latency p50 / p99 ms", ["--rate", "5000"], "latency"),
        # amqbench runs one consumer per fanout queue; leveret perf needs that spelled out.
        Scenario(
            "S4",
            "fanout to 10 queues: deliveries/s",
            ["--fanout", "10"],
            "consumed",
            ["--consumers", "10"],
        ),
        Scenario("S5", "4 KB, autoack: msg/s", ["--size", "4096", "--autoack"], "consumed"),
        # S4 with durable queues and persistent messages under confirms.
        Scenario(
            "S4D",
            "fanout to 10 durable queues, persistent, confirm window 1000: deliveries/s",
            ["--fanout", "10", "--persistent", "--confirm", "1000"],
            "consumed",
            ["--consumers", "10"],
        ),
        # Many queues and connections at once. Producer i publishes to queue
        # i mod 100, one consumer per queue; 100 unconfirmed a producer (10,000 in all).
        Scenario(
            "S8",
            "100 durable queues, 100 producers, 100 consumers, persistent, confirm window "
            "100 each: confirmed/s",
            ["--persistent", "--confirm", "100"],
            "confirmed",
            ["--queues", "100", "--producers", "100", "--consumers", "100"],
            tools=("leveret perf",),
        ),
    ]
}
MEMORY_SCENARIOS = {
    "S6": "1000 idle connections: RSS KB per connection",
    "S7": "1M x 1 KB queued: publish msg/s, RSS MB",
}
# Many long queues (bench/long_queues.py, the same client for both brokers).
LONG_QUEUE_SCENARIOS = {
    "S9": "1,000 long durable queues x 10,000 persistent 16 B messages: RSS full, time to drain",
}
LONG_QUEUE_FIGURES = {
    "rss_full_mb": ("RSS MB with every queue full", 1),
    "drain_seconds": ("seconds to drain them all (one consumer a queue, autoack)", 2),
    "fill_per_s": ("fill rate, confirmed msg/s", 0),
}
# Stream queues: bench/streams.py, the same leveret.client code for both brokers.
STREAM_SCENARIOS = {
    "ST": "stream queues: publish with confirms, consume from first x1 and x4",
}
STREAM_FIGURES = {
    "publish": "ST1 stream publish, 100 B persistent, confirm window 1000: msg/s",
    "consume_x1": "ST2 stream consume from first, 1 consumer, prefetch 1000: msg/s",
    "consume_x4": "ST3 stream consume from first, 4 consumers at once: msg/s (all)",
}
# Many busy queues at once, each with a load generator of its own: what a broker does
# with the machine's cores (docs/benchmarks.md#s10).
MULTI_SCENARIOS = {
    "S10": "N queues, each with its own amqbench process (1 producer, 1 consumer): "
    "msg/s summed over the N",
}
#: S10's shapes: (amqbench flags, the figure summed)
S10_SHAPES = {
    "S1": (["--size", "16", "--prefetch", "500"], "consumed"),
    "S2": (["--persistent", "--confirm", "1000", "--prefetch", "500"], "confirmed"),
}
ALL_SCENARIOS = [
    *SCENARIOS,
    *MEMORY_SCENARIOS,
    *LONG_QUEUE_SCENARIOS,
    *STREAM_SCENARIOS,
    *MULTI_SCENARIOS,
]


@dataclass
class Outcome:
    """One tool run against one broker: a figure (or tuple for latency) or an error."""

    value: float | tuple[float, float] | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


def run_json_command(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> Any:
    """Run a tool that prints one JSON object (last JSON line of stdout wins)."""
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=raise_fd_limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout:g} s: {' '.join(argv)}") from None
    for line in reversed(res.stdout.strip().splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if res.returncode != 0 and not data.get("errors"):
                data.setdefault("errors", []).append(f"exit status {res.returncode}")
            return data
    raise RuntimeError(f"exit status {res.returncode}: {tail(res.stderr or res.stdout)}")


def perf_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    return env


def pick(data: dict[str, Any], figure: str, tool: str) -> float | tuple[float, float] | None:
    if figure == "latency":
        if tool == "amqbench":
            p50, p99 = data.get("lat_ms_p50"), data.get("lat_ms_p99")
        else:
            p50, p99 = data["latency_ms"]["p50"], data["latency_ms"]["p99"]
        return None if p50 is None or p99 is None else (float(p50), float(p99))
    return float(data[f"{figure}_per_s"])


def run_tool(
    tool: str,
    scenario: Scenario,
    broker: Broker,
    seconds: float,
    warmup: float,
    python: str,
    amqbench: Path,
) -> Outcome:
    """Run amqbench or `leveret perf` for one scenario against one broker."""
    timeout = seconds + warmup + 120
    try:
        reset_topology(broker)
    except Exception as exc:  # noqa: BLE001 - reported as the run's error
        return Outcome(error=f"could not reset the benchmark's queues: {exc}")
    if tool == "amqbench":
        argv = [python, str(amqbench), "--port", str(broker.port)]
        argv += ["--seconds", str(seconds), "--warmup", str(warmup), *scenario.flags]
        env = None
    else:
        argv = [python, "-m", "leveret.perf", "--uri", broker.uri, "--json", "--quiet"]
        argv += ["--duration", str(seconds), "--warmup", str(warmup)]
        argv += [*scenario.flags, *scenario.perf_extra]
        env = perf_env()
    try:
        data = run_json_command(argv, timeout, env)
    except (RuntimeError, json.JSONDecodeError) as exc:
        return Outcome(error=str(exc))
    outcome = Outcome(warnings=[str(e) for e in data.get("errors") or []])
    try:
        outcome.value = pick(data, scenario.figure, tool)
    except (KeyError, TypeError, ValueError) as exc:
        outcome.error = f"unexpected output ({exc!r})"
    if outcome.value is None and outcome.error is None:
        outcome.error = "no figure (nothing consumed?)"
    return outcome


def amqbench_per_queue(amqbench: Path, into: Path) -> Path:
    """A copy of the referee amqbench.py whose queue names start with $AMQB_Q instead of
    `bench.q`, so that N copies at once use N queues (device-pack.sh makes the same
    copy for the many-core machine). The referee itself is not changed."""
    text = amqbench.read_text()
    fixed = "f'bench.q{i}'"
    if fixed not in text or "import argparse, asyncio, json, struct, time, os" not in text:
        raise RuntimeError(f"{amqbench} names its queues in a way S10 does not know")
    out = into / "amqbench_per_queue.py"
    out.write_text(text.replace(fixed, "os.environ.get('AMQB_Q', 'bench.q') + str(i)"))
    return out


def run_multi(
    broker: Broker,
    queues: int,
    shape: str,
    seconds: float,
    warmup: float,
    python: str,
    script: Path,
) -> Outcome:
    """S10: `queues` amqbench processes at once, each on a queue of its own; the sum of
    their figures (a run where one fails is an error, not a smaller sum)."""
    flags, figure = S10_SHAPES[shape]
    prefixes = [f"s10.{shape}.{queues}.{i}." for i in range(queues)]
    try:
        _delete_queues(broker, [p + "0" for p in prefixes])
    except Exception as exc:  # noqa: BLE001 - reported as the run's error
        return Outcome(error=f"could not reset the S10 queues: {exc}")
    argv = [python, str(script), "--port", str(broker.port)]
    argv += ["--seconds", str(seconds), "--warmup", str(warmup), *flags]
    procs = [
        subprocess.Popen(
            argv,
            env={**os.environ, "AMQB_Q": prefix},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix in prefixes
    ]
    total, errors = 0.0, []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=seconds + warmup + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            errors.append("timed out")
            continue
        try:
            value = pick(json.loads(out.strip().splitlines()[-1]), figure, "amqbench")
        except (IndexError, KeyError, ValueError, TypeError):
            errors.append(f"exit {proc.returncode}: {tail(err or out, 2)}")
            continue
        total += float(value)  # type: ignore[arg-type]
    with contextlib.suppress(Exception):
        _delete_queues(broker, [p + "0" for p in prefixes])
    if errors:
        return Outcome(error=f"{len(errors)} of {queues} load generators failed: {errors[0]}")
    return Outcome(value=total)


def _delete_queues(broker: Broker, names: list[str]) -> None:
    from leveret.client.blocking import connect

    with connect(broker.uri, recovery=False) as conn:
        ch = conn.channel()
        for name in names:
            ch.delete_queue(name)


BENCH_QUEUES = [f"bench.q{i}" for i in range(10)]


def reset_topology(broker: Broker) -> None:
    """Delete the exchange and queues amqbench declares. S4 declares them transient
    and S4D durable; a broker keeps whichever came first (RabbitMQ across restarts,
    too), and the other scenario's declare then fails with 406."""
    from leveret.client.blocking import connect

    with connect(broker.uri, recovery=False) as conn:
        ch = conn.channel()
        ch.delete_exchange("bench.fanout")
        for name in BENCH_QUEUES:
            ch.delete_queue(name)


def run_streams(broker: Broker, python: str, messages: int) -> dict[str, Outcome]:
    """One bench/streams.py run against one broker: an Outcome per stream figure."""
    argv = [python, str(REPO / "bench" / "streams.py"), "--uri", broker.uri]
    argv += ["--messages", str(messages), "--json"]
    try:
        data = run_json_command(argv, timeout=600, env=perf_env())
    except (RuntimeError, json.JSONDecodeError) as exc:
        return {k: Outcome(error=str(exc)) for k in STREAM_FIGURES}
    return {
        k: Outcome(value=float(data[k])) if k in data else Outcome(error=f"no {k} in output")
        for k in STREAM_FIGURES
    }


def run_long_queues(broker: Broker, python: str, queues: int, messages: int) -> dict[str, Outcome]:
    """One bench/long_queues.py run (S9) against one broker: an Outcome per figure."""
    if broker.pid is None:
        return {k: Outcome(error="broker PID unknown") for k in LONG_QUEUE_FIGURES}
    argv = [python, str(REPO / "bench" / "long_queues.py"), "--port", str(broker.port)]
    argv += ["--pid", str(broker.pid), "--queues", str(queues), "--messages", str(messages)]
    try:
        data = run_json_command(argv, timeout=7200, env=perf_env())
    except (RuntimeError, json.JSONDecodeError) as exc:
        return {k: Outcome(error=str(exc)) for k in LONG_QUEUE_FIGURES}
    return {
        k: Outcome(value=float(data[k])) if k in data else Outcome(error=f"no {k} in output")
        for k in LONG_QUEUE_FIGURES
    }


def run_memcheck(
    broker: Broker, memcheck: Path, python: str, conns: int, msgs: int
) -> dict[str, Any] | str:
    """S6+S7 in one memcheck.py run; returns its JSON or an error string."""
    if broker.pid is None:
        return "broker PID unknown"
    argv = [python, str(memcheck), str(broker.port), str(broker.pid)]
    argv += ["--conns", str(conns), "--msgs", str(msgs)]
    try:
        return run_json_command(argv, timeout=1800)
    except (RuntimeError, json.JSONDecodeError) as exc:
        return str(exc)


# -- formatting -------------------------------------------------------------------------


def fmt(value: float | tuple[float, float] | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return " / ".join(f"{v:.2f}" for v in value)
    return f"{value:,.{digits}f}"


def ratio(a: float | tuple[float, float] | None, b: float | tuple[float, float] | None) -> str:
    if a is None or b is None:
        return "n/a"
    if isinstance(a, tuple) and isinstance(b, tuple):
        return " / ".join(f"{x / y:.2f}" if y else "n/a" for x, y in zip(a, b, strict=True))
    if isinstance(a, tuple) or isinstance(b, tuple) or not b:
        return "n/a"
    return f"{a / b:.2f}"


def machine() -> str:
    """Which machine the figures come from: CPU model, cores, RAM, Python."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        ram = f", {kb / 1024 / 1024:.0f} GB RAM"
    py = ".".join(map(str, sys.version_info[:3]))
    return f"{cpu}, {os.cpu_count()} cores{ram}, Python {py}"


def median_outcome(outs: list[Outcome]) -> Outcome:
    """The median of several rounds (element-wise for latency pairs); a failed round
    becomes a warning, and the row is an error only if every round failed."""
    good = [o for o in outs if not o.error and o.value is not None]
    warnings = [w for o in outs for w in o.warnings]
    failed = [o.error for o in outs if o.error]
    if not good:
        return Outcome(error=failed[0] if failed else "not run", warnings=warnings)
    if failed:
        warnings.append(f"{len(failed)} of {len(outs)} rounds failed: {failed[0]}")
    first = good[0].value
    if isinstance(first, tuple):
        value: float | tuple[float, float] = tuple(  # type: ignore[assignment]
            statistics.median(o.value[i] for o in good)  # type: ignore[index]
            for i in range(len(first))
        )
    else:
        value = statistics.median(o.value for o in good)  # type: ignore[misc]
    return Outcome(value=value, warnings=warnings)


def ratio_spread(pairs: list[tuple[Outcome, Outcome]]) -> str:
    """min-max of the per-round Leveret/RabbitMQ ratios (rounds paired as they ran)."""
    ratios: list[tuple[float, ...]] = []
    for lv, rv in pairs:
        a, b = lv.value, rv.value
        if lv.error or rv.error or a is None or b is None:
            continue
        a_t = a if isinstance(a, tuple) else (a,)
        b_t = b if isinstance(b, tuple) else (b,)
        if all(b_t):
            ratios.append(tuple(x / y for x, y in zip(a_t, b_t, strict=True)))
    if len(ratios) < 2:
        return "—"
    return " / ".join(
        f"{min(r[i] for r in ratios):.2f}–{max(r[i] for r in ratios):.2f}"
        for i in range(len(ratios[0]))
    )


@dataclass
class Row:
    label: str
    leveret: Outcome | None
    rabbitmq: Outcome | None
    digits: int = 0
    spread: str = "—"  # min–max of the per-round ratios, when there were rounds

    def cells(self) -> list[str]:
        def cell(o: Outcome | None) -> str:
            if o is None:
                return "not run"
            if o.error:
                return "error"
            return fmt(o.value, self.digits) + (" (!)" if o.warnings else "")

        lv = self.leveret.value if self.leveret and not self.leveret.error else None
        rv = self.rabbitmq.value if self.rabbitmq and not self.rabbitmq.error else None
        return [self.label, cell(self.leveret), cell(self.rabbitmq), ratio(lv, rv), self.spread]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |"]
    out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return "\n".join(out)


def notes_for(rows: list[Row]) -> list[str]:
    notes = []
    for row in rows:
        for name, o in (("Leveret", row.leveret), ("RabbitMQ", row.rabbitmq)):
            if o is None:
                continue
            if o.error:
                notes.append(f"{row.label} / {name}: error: {o.error}")
            for w in o.warnings:
                notes.append(f"{row.label} / {name}: reported (!): {w}")
    return notes


def plot_sweep(
    path: str, sizes: list[int], series: dict[str, list[float | None]], log_fn: Callable = log
) -> bool:
    """Throughput vs message size, msg/s and MB/s; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log_fn(
            "matplotlib is not installed, so no plot was written "
            f"to {path} (pip install matplotlib); the sweep table is still printed"
        )
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, values in series.items():
        pts = [(s, v) for s, v in zip(sizes, values, strict=True) if v is not None]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        ax1.plot(xs, ys, marker="o", label=name)
        ax2.plot(xs, [s * v / 1e6 for s, v in pts], marker="o", label=name)
    for ax, ylabel in ((ax1, "messages/s consumed"), (ax2, "MB/s of body consumed")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("leveret perf: 1 producer, 1 consumer, manual ack, prefetch 500")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True
