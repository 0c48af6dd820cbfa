"""Replay the recorded management API table against Leveret and list the differences.

    python -m tests.compat.http.replay [--all] [--only GLOB] [--management URL --amqp URL]

Without URLs it starts an in-process Leveret (as the CI test does). `--all` also
prints the differences the allow-list allows; the summary counts them per group.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..common import Difference, compare, read_json, split_allowed
from .allowed import ALLOWED
from .cases import all_cases
from .runner import Target, run_all

RECORDINGS = Path(__file__).resolve().parent / "recordings"
#: differences found and not yet closed (not allowed: gaps to fix), one "case kind path"
#: a line; the replay test fails on any difference not here nor allowed, and on a line
#: here that no longer differs (then run with --update-gaps and commit the file)
KNOWN_GAPS = Path(__file__).resolve().parent / "known_gaps.txt"


def gap_key(diff: Difference) -> str:
    return f"{diff.case} {diff.kind} {diff.path or '-'}"


def known_gaps(path: Path = KNOWN_GAPS) -> set[str]:
    if not path.exists():
        return set()
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def recordings() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(RECORDINGS.glob("*.json")):
        out.update(read_json(path))
    return out


def crashed(record: dict[str, Any]) -> bool:
    """RabbitMQ answered 500 with no body: an Erlang crash, not behaviour to copy."""
    return record["status"] == 500 and record.get("shape") == "empty"


def differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[Difference]:
    out = []
    for name, want in expected.items():
        got = actual.get(name)
        if got is None:
            out.append(Difference(name, "case", "", "recorded", "not run"))
            continue
        if crashed(want):
            # Leveret must give a clear error instead: a 4xx with RabbitMQ's error body.
            error_body = (
                isinstance(got.get("body"), dict) and {"error", "reason"} <= got["body"].keys()
            )
            if not (400 <= got["status"] < 500 and error_body):
                out.append(Difference(name, "status", "", "4xx error body", got["status"]))
            else:
                out.append(Difference(name, "crash", "", 500, got["status"]))
            continue
        out += compare(name, want, got)
    return out


@contextmanager
def leveret() -> Any:
    """An in-process Leveret with its management API and Prometheus on ephemeral ports,
    storing messages in a temporary directory (as the reference RabbitMQ does); under
    LEVERET_TEST_WORKERS=N a `leveret server --workers N` subprocess whose management
    API is worker 0's."""
    if os.environ.get("LEVERET_TEST_WORKERS"):
        with leveret_workers() as target:
            yield target
        return
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    with tempfile.TemporaryDirectory(prefix="leveret-compat-") as data_dir:
        config = ServerConfig(port=0, data_dir=data_dir, management_port=0, prometheus_port=0)
        with embedded_broker(config) as broker:
            yield Target(f"http://127.0.0.1:{broker.server.management.port}", broker.url)


@contextmanager
def leveret_workers() -> Any:
    """`leveret server --workers N` (tests/serverproc.py: N from LEVERET_TEST_WORKERS)
    with its management API and Prometheus on free ports (both are listed in the
    node's `contexts`) and its data in a temporary directory."""
    from serverproc import start_logged_server

    from ..amqp.target import _wait_http

    http_port, prometheus_port = _free_port(), _free_port()
    args = ("--management-port", str(http_port), "--prometheus-port", str(prometheus_port))
    with tempfile.TemporaryDirectory(prefix="leveret-compat-") as tmp:
        with start_logged_server(Path(tmp), *args) as port:
            management = f"http://127.0.0.1:{http_port}"
            _wait_http(management)
            yield Target(management, f"amqp://guest:guest@127.0.0.1:{port}/%2F")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay(target: Target, only: str | None = None) -> tuple[dict[str, Any], list[Difference]]:
    expected = recordings()
    if only:
        expected = {k: v for k, v in expected.items() if fnmatch.fnmatchcase(k, only)}
    cases = [c for c in all_cases() if c.name in expected]
    actual = run_all(target, cases)
    return expected, differences(expected, actual)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also print allowed differences")
    parser.add_argument("--only", default=None)
    parser.add_argument("--management", default=None)
    parser.add_argument("--amqp", default=None)
    parser.add_argument("--update-gaps", action="store_true", help="rewrite known_gaps.txt")
    args = parser.parse_args(argv)
    if args.management:
        expected, diffs = replay(Target(args.management, args.amqp), args.only)
    else:
        with leveret() as target:
            expected, diffs = replay(target, args.only)
    left, _used = split_allowed(diffs, ALLOWED)
    if args.update_gaps:
        KNOWN_GAPS.write_text("".join(f"{k}\n" for k in sorted({gap_key(d) for d in left})))
    for diff in diffs if args.all else left:
        print(diff)
    per_group: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    cases_with = {d.case for d in diffs}
    cases_left = {d.case for d in left}
    for name in expected:
        group = name.split(".")[0]
        per_group[group][0] += 1
        per_group[group][1] += name in cases_with
        per_group[group][2] += name in cases_left
    print(f"{'group':32} cases  differing  not-allowed")
    for group, (n, d, kept) in sorted(per_group.items()):
        print(f"{group:32} {n:5}  {d:9}  {kept:11}")
    print(
        f"{'total':32} {len(expected):5}  {len(cases_with):9}  {len(cases_left):11}"
        f"   ({len(diffs)} differences, {len(left)} not allowed)"
    )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
