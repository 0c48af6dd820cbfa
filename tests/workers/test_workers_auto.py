"""`leveret server --workers auto` (and `workers = "auto"` in the config file): one
worker per usable CPU, what an existing data dir was made with, one process where
workers cannot run; and the errors of a bad count. Real processes, pinned to CPUs
with their affinity mask as `taskset` pins them."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from leveret.cli import _resolve_workers, build_parser
from leveret.workers.count import AUTO, cgroup_cpu_limit, parse, resolve, usable_cpus
from serverproc import QUIET_PORTS, server_argv
from workers.procs import Workers, wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers and affinity masks: Linux"
)

ONE_PROCESS = re.compile(r"leveret\.server: Leveret listening for AMQP 0-9-1 on 127\.0\.0\.1:(\d+)")


class Broker(Workers):
    """`leveret server` with `--workers <count>` (no flag at all for None), its
    CPU affinity narrowed to `cpus` when given."""

    def __init__(
        self, tmp: Path, count: int | str | None, *args: str, cpus: set[int] | None = None
    ) -> None:
        self.data = tmp / "data"
        self.log = tmp / f"server-{len(list(tmp.glob('server-*.log')))}.log"  # one each
        base = ["--port", "0", "--data-dir", str(self.data), *args]
        if count is None:
            argv = [sys.executable, "-m", "leveret", "server", *QUIET_PORTS, *base]
        else:
            argv = server_argv(*base, workers=count)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        self.port = 0

    def wait_one_process(self) -> Broker:
        def listening():
            """the one-process broker's listening line"""
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.text()}")
            return ONE_PROCESS.search(self.text())

        self.port = int(wait_for(listening).group(1))
        return self


@pytest.fixture
def broker(tmp_path: Path):
    made: list[Broker] = []

    def start(count: int | str | None, *args: str, cpus: set[int] | None = None) -> Broker:
        b = Broker(tmp_path, count, *args, cpus=cpus)
        made.append(b)
        return b

    yield start
    for b in made:
        b.kill()


def two_cpus() -> set[int]:
    """Two CPUs of this process's affinity (the test is skipped with fewer, or under
    a CPU quota below 2, where `auto` rightly gives 1)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or usable_cpus()[0] < 2:
        pytest.skip("needs two usable CPUs")
    return set(cpus[:2])


def test_auto_runs_one_worker_per_cpu_of_its_affinity(broker) -> None:
    b = broker(AUTO, cpus=two_cpus()).wait_listening()
    assert len(b.status()["workers"]) == 2
    assert all(w["ready"] for w in b.status()["workers"])
    assert "--workers auto: 2 workers, one per usable CPU (2 in this process's CPU affinity)" in (
        b.text()
    )
    assert b.stop() == 0


def test_auto_on_one_cpu_is_one_process(broker) -> None:
    b = broker(AUTO, cpus={min(os.sched_getaffinity(0))}).wait_one_process()
    assert "--workers auto: one process: one usable CPU (1 in this process's CPU affinity)" in (
        b.text()
    )
    assert not (b.data / "workers-status.json").exists()
    assert not (b.data / "workers.json").exists()
    assert (b.data / "definitions.db").exists()  # the one-process layout
    assert b.stop() == 0


def test_auto_keeps_the_count_a_data_dir_was_made_with(broker) -> None:
    first = broker(2).wait_listening()
    assert first.stop() == 0
    # one CPU now: auto would be 1 on a fresh data dir, but the data dir's queues
    # are in two workers' stores
    again = broker(AUTO, cpus={min(os.sched_getaffinity(0))}).wait_listening()
    assert len(again.status()["workers"]) == 2
    assert re.search(
        r"--workers auto: 2 workers, the count the data dir \S+ was made with", again.text()
    )
    assert again.stop() == 0
    # an explicit count that differs is refused as before, naming both ways out
    three = broker(3)
    assert three.proc.wait(timeout=60) == 2
    assert "belongs to a broker of --workers 2; start it with --workers 2 or --workers auto" in (
        three.text()
    )


def test_auto_keeps_a_one_process_data_dir_at_one(broker) -> None:
    single = broker(1).wait_one_process()
    with single.connect() as conn:
        conn.channel().queue_declare("wk-auto-kept", durable=True)
    assert single.stop() == 0
    # two CPUs: auto would start workers on a fresh data dir
    again = broker(AUTO, cpus=two_cpus()).wait_one_process()
    assert re.search(
        r"--workers auto: one process: the data dir \S+ holds a one-process broker's "
        r"store, which workers would not read",
        again.text(),
    )
    assert not (again.data / "workers.json").exists()
    with again.connect() as conn:  # its queue is still there
        conn.channel().queue_declare("wk-auto-kept", passive=True)
    assert again.stop() == 0


def test_the_default_is_auto_and_keeps_an_upgraded_data_dir_at_one(broker, tmp_path: Path) -> None:
    """No --workers and no config file: `auto`. A one-process broker's data dir (one
    made while the default was one process) still opens as one process; a new data
    dir on two CPUs gets two workers."""
    single = broker(1).wait_one_process()
    assert single.stop() == 0
    upgraded = broker(None, cpus=two_cpus()).wait_one_process()
    assert "--workers auto: one process: the data dir" in upgraded.text()
    assert upgraded.stop() == 0
    (tmp_path / "fresh").mkdir()
    fresh = Broker(tmp_path / "fresh", None, cpus=two_cpus())
    try:
        fresh.wait_listening()
        assert len(fresh.status()["workers"]) == 2
        assert "--workers auto: 2 workers, one per usable CPU" in fresh.text()
        assert fresh.stop() == 0
    finally:
        fresh.kill()


def test_workers_auto_in_the_config_file(broker, tmp_path: Path) -> None:
    config = tmp_path / "auto.toml"
    config.write_text('workers = "auto"\n')
    b = broker(None, "--config", str(config), cpus=two_cpus()).wait_listening()
    assert len(b.status()["workers"]) == 2
    assert "--workers auto: 2 workers" in b.text()
    assert b.stop() == 0


def test_workers_in_the_config_file(broker, tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("workers = 2\n")
    b = broker(None, "--config", str(good)).wait_listening()
    assert len(b.status()["workers"]) == 2
    assert b.stop() == 0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("workers = 0", "key 'workers': must be at least 1 (or 'auto'), got 0"),
        ("workers = -1", "key 'workers': must be at least 1 (or 'auto'), got -1"),
        ('workers = "x"', "key 'workers': expected a whole number from 1 or 'auto', got 'x'"),
        ("workers = 1.5", "key 'workers': expected a whole number from 1 or 'auto', got 1.5"),
        ("workers = true", "key 'workers': expected a whole number from 1 or 'auto', got True"),
    ],
)
def test_a_bad_workers_value_in_the_config_file_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--config", str(bad), "--port", "0",
         "--data-dir", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "leveret server: bad config file:" in out.stderr
    assert problem in out.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "must be at least 1 (or 'auto'), got 0"),
        ("-1", "must be at least 1 (or 'auto'), got -1"),
        ("many", "expected a whole number from 1 or 'auto', got 'many'"),
        ("", "expected a whole number from 1 or 'auto', got ''"),
    ],
)
def test_a_bad_workers_flag_is_refused(tmp_path: Path, value: str, problem: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--workers", value, "--data-dir",
         str(tmp_path / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"argument --workers: {problem}" in out.stderr
    assert not (tmp_path / "x").exists()


def test_help_names_auto() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--workers N|auto" in text
    assert "auto: one per CPU this process may use" in text


def test_auto_with_a_cluster_is_one_process(tmp_path: Path, caplog) -> None:
    """The CLI's resolution, not a started node (which would wait for its etcd)."""
    args = build_parser().parse_args(
        ["server", "--workers", "auto", "--data-dir", str(tmp_path / "d"),
         "--cluster-etcd", "http://127.0.0.1:1"]
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="leveret"):
        assert _resolve_workers(args) == 1
    assert (
        "--workers auto: one process: every node of a cluster (--cluster-etcd) must run the same count; "
        "give it as --workers N" in (caplog.text)
    )


def test_auto_resolution_cases(tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh")
    assert resolve(3, fresh).count == 3
    assert resolve(AUTO, fresh, platform="darwin").count == 1
    assert "workers need Linux, this is darwin" in resolve(AUTO, fresh, platform="darwin").reason
    assert resolve(AUTO, fresh, cpus=(8, "test")).count == 8
    assert resolve(AUTO, fresh, cpus=(1, "test")).count == 1
    # an unreadable record is the same error a start gives
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "workers.json").write_text("{not json")
    from leveret.workers.serve import WorkersError

    with pytest.raises(WorkersError, match="workers.json cannot be read"):
        resolve(AUTO, str(tmp_path / "bad"), cpus=(4, "test"))


def test_parse() -> None:
    assert parse("auto") == AUTO
    assert parse(" AUTO ") == AUTO
    assert parse("3") == 3
    assert parse(2) == 2
    for bad in ("0", "-2", "x", "", 0, 1.0, True, None):
        with pytest.raises(ValueError):
            parse(bad)


def _cgroup_tree(tmp_path: Path, v2: bool, limits: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """A cgroup file system in `tmp_path`: the process in /a/b; `limits` maps a
    cgroup dir ("", "a", "a/b") to its quota and period."""
    mount = tmp_path / "cgroup"
    for rel in ("", "a", "a/b"):
        (mount / rel).mkdir(parents=True, exist_ok=True)
    for rel, (quota, period) in limits.items():
        if v2:
            (mount / rel / "cpu.max").write_text(f"{quota} {period}\n")
        else:
            (mount / rel / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            (mount / rel / "cpu.cfs_period_us").write_text(f"{period}\n")
    mountinfo = tmp_path / "mountinfo"
    cgroups = tmp_path / "cgroup.txt"
    if v2:
        mountinfo.write_text(f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n")
        cgroups.write_text("0::/a/b\n")
    else:
        mountinfo.write_text(
            f"31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
            f"32 31 0:29 / {mount} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        )
        cgroups.write_text("4:memory:/x\n2:cpu,cpuacct:/a/b\n")
    return str(mountinfo), str(cgroups)


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
def test_cgroup_quota_is_the_tightest_on_the_way_up(tmp_path: Path, v2: bool) -> None:
    none = "max" if v2 else "-1"
    # no quota anywhere
    assert cgroup_cpu_limit(*_cgroup_tree(tmp_path / "1", v2, {"a/b": (none, "100000")})) is None
    # a quota on a parent, none on the process's own cgroup
    limit, where = cgroup_cpu_limit(
        *_cgroup_tree(tmp_path / "2", v2, {"a": ("250000", "100000"), "a/b": (none, "100000")})
    )
    assert limit == 2.5
    assert where.endswith("a")
    # the tighter of two
    limit, where = cgroup_cpu_limit(
        *_cgroup_tree(tmp_path / "3", v2, {"": ("400000", "100000"), "a/b": ("50000", "100000")})
    )
    assert limit == 0.5
    assert where.endswith(os.path.join("a", "b"))


def test_a_quota_lowers_the_count_rounding_down(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs two CPUs in the affinity mask")
    files = _cgroup_tree(tmp_path, True, {"a": ("150000", "100000")})
    count, where = usable_cpus(*files)
    assert count == 1
    assert "the CPU quota of 1.5 CPUs on cgroup" in where
    # a quota above the affinity leaves the affinity's count
    files = _cgroup_tree(tmp_path / "big", True, {"a": (str(100000 * (cpus + 2)), "100000")})
    assert usable_cpus(*files) == (cpus, f"{cpus} in this process's CPU affinity")
