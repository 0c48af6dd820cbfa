"""How many workers `leveret server --workers N|auto` runs.

A number is taken as given. `auto` means one worker per CPU this process may use,
where workers can run:

- the CPUs are the process's affinity mask (`os.sched_getaffinity`, which `taskset`
  and a cpuset cgroup narrow, where `os.cpu_count()` counts the whole machine),
  lowered to a CPU bandwidth quota on its cgroup or any cgroup above it
  (`cpu.max`, or cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`), so a
  container limited to 2 CPUs on a 64-core host runs 2 workers, not 64. A quota is
  rounded down (at least 1): each worker is a busy event loop, and a quota of 2.5
  CPUs with 3 workers would have the kernel throttle all of them; the fraction is
  left to the supervisor and the workers' helper threads;
- one process (1) where workers are not offered: not Linux, a single usable CPU,
  and a cluster node (`cluster_etcd`): every node of a cluster must run the same
  count, which CPUs that differ between machines would not give, so a cluster of
  workers takes an explicit number;
- an existing data dir decides before the CPUs do: a broker of workers keeps the
  count its data dir was made with (`workers.json`: each worker's store holds its
  own share of the queues), and a one-process broker's data dir stays one process
  (its store is in the top dir, which no worker reads), so `auto` never opens a
  data dir in a layout that would not find its queues.

`resolve` returns the count with the reason, which the CLI logs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

AUTO = "auto"
#: what `leveret server` runs without --workers (or `workers` in its config file):
#: a number or AUTO. `ServerConfig.workers` (the in-process brokers of
#: `leveret.testing`) stays 1 whatever this is.
DEFAULT: int | str = AUTO


def parse(value: object) -> int | str:
    """A whole number from 1, or AUTO; ValueError says what is wrong.

    Takes the text of `--workers` or the value of the config file's `workers`
    (an integer or a string)."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number from 1 or 'auto', got {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number from 1 or 'auto', got {value!r}")
    if value < 1:
        raise ValueError(f"must be at least 1 (or 'auto'), got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class Resolution:
    count: int
    #: why `auto` gave this count (empty for an explicit number)
    reason: str = ""


def resolve(
    requested: int | str,
    data_dir: str,
    cluster: bool = False,
    platform: str = sys.platform,
    cpus: tuple[int, str] | None = None,
) -> Resolution:
    """The worker count to run for `requested` (a number or AUTO).

    `cpus` is `usable_cpus()` unless given. WorkersError if the data dir's record
    cannot be read."""
    if requested != AUTO:
        return Resolution(int(requested))
    # (here, not at the top: the CLI reads DEFAULT for every command)
    from leveret.workers.serve import holds_a_store, read_layout

    if not platform.startswith("linux"):
        return Resolution(1, f"one process: workers need Linux, this is {platform}")
    if cluster:
        return Resolution(
            1,
            "one process: every node of a cluster (--cluster-etcd) must run the same count; "
            "give it as --workers N",
        )
    layout = read_layout(data_dir)
    recorded = layout.get("workers") if isinstance(layout, dict) else None
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        return Resolution(
            recorded,
            f"{recorded} workers, the count the data dir {data_dir} was made with "
            "(its workers.json; each worker's store holds its own queues)",
        )
    if layout is None and holds_a_store(data_dir):
        return Resolution(
            1,
            f"one process: the data dir {data_dir} holds a one-process broker's store, "
            "which workers would not read; to run workers, change its count first: "
            f"leveret reshard --data-dir {data_dir} --workers N",
        )
    count, where = cpus if cpus is not None else usable_cpus()
    if count < 2:
        return Resolution(1, f"one process: one usable CPU ({where})")
    return Resolution(count, f"{count} workers, one per usable CPU ({where})")


def usable_cpus(
    mountinfo: str = "/proc/self/mountinfo", cgroups: str = "/proc/self/cgroup"
) -> tuple[int, str]:
    """The CPUs this process may use, and where that figure comes from."""
    try:
        count = len(os.sched_getaffinity(0))
        where = f"{count} in this process's CPU affinity"
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
        where = f"{count} on this machine"
    quota = cgroup_cpu_limit(mountinfo, cgroups)
    if quota is not None:
        limit, path = quota
        allowed = max(1, math.floor(limit))
        if allowed < count:
            return allowed, f"the CPU quota of {limit:g} CPUs on cgroup {path}; {where}"
    return count, where


def cgroup_cpu_limit(mountinfo: str, cgroups: str) -> tuple[float, str] | None:
    """The tightest CPU bandwidth quota (in CPUs) on this process's cgroup or any
    cgroup above it that is visible here, with the directory it is set on; None if
    there is none (or no cgroup file system)."""
    try:
        with open(mountinfo, encoding="utf-8") as f:
            mounts = f.read().splitlines()
        with open(cgroups, encoding="utf-8") as f:
            memberships = f.read().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}  # "v2" or a v1 controller -> the process's cgroup path
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            paths["v2"] = path
        else:
            for controller in controllers.split(","):
                paths[controller] = path
    best: tuple[float, str] | None = None
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 2 or sep < 5:
            continue
        root, point, fstype = fields[3], fields[4], fields[sep + 1]
        if fstype == "cgroup2" and "v2" in paths:
            found = _walk(point, root, paths["v2"], _read_cpu_max)
        elif fstype == "cgroup" and "cpu" in fields[-1].split(",") and "cpu" in paths:
            found = _walk(point, root, paths["cpu"], _read_cfs)
        else:
            continue
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best


def _walk(point: str, root: str, path: str, read) -> tuple[float, str] | None:
    """The lowest limit `read(dir)` finds from the process's cgroup dir up to the
    mount point. `root` is the cgroup the mount shows at `point` (not "/" in a
    container without its own cgroup namespace)."""
    point = _unescape(point)
    root, path = _unescape(root), _unescape(path)
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root) :]
    elif root != "/":
        path = "/"  # our cgroup is outside what this mount shows: only its top
    directory = os.path.normpath(os.path.join(point, path.lstrip("/")))
    best: tuple[float, str] | None = None
    while True:
        limit = read(directory)
        if limit is not None and (best is None or limit < best[0]):
            best = (limit, directory)
        if directory == os.path.normpath(point) or len(directory) <= len(point):
            return best
        directory = os.path.dirname(directory)


def _unescape(text: str) -> str:
    """mountinfo and /proc/self/cgroup escape spaces and the like as \\ooo."""
    if "\\" not in text:
        return text
    return text.encode("latin-1").decode("unicode_escape")


def _read_cpu_max(directory: str) -> float | None:
    """cgroup v2: `cpu.max` is "QUOTA PERIOD" in microseconds, or "max PERIOD"."""
    try:
        with open(os.path.join(directory, "cpu.max"), encoding="ascii") as f:
            parts = f.read().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def _read_cfs(directory: str) -> float | None:
    """cgroup v1: `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`."""
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us"), encoding="ascii") as f:
            quota = f.read().strip()
        with open(os.path.join(directory, "cpu.cfs_period_us"), encoding="ascii") as f:
            period = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return q / p
