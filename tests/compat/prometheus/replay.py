"""Replay the recorded Prometheus families against Leveret and list the differences.

    python -m tests.compat.prometheus.replay [--all]

Starts an in-process Leveret (as the CI test does), runs the same workload as the
recording, scrapes every endpoint and compares family names, types and label names.
`--all` also prints the differences the allow-list allows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..common import Difference, read_json, split_allowed
from . import workload
from .allowed import ALLOWED
from .scrape import scrape

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def recording() -> dict[str, Any]:
    return read_json(RECORDINGS / "families.json")


def differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[Difference]:
    """Per endpoint (the case): missing, extra, type and labels differences by family."""
    out: list[Difference] = []
    for endpoint, want in expected.items():
        got = actual.get(endpoint, {"status": None})
        if want["status"] != got["status"]:
            out.append(Difference(endpoint, "status", "", want["status"], got["status"]))
            continue
        if want.get("content_type") != got.get("content_type"):
            out.append(
                Difference(
                    endpoint, "value", "content_type", want["content_type"], got["content_type"]
                )
            )
        fams, have = want.get("families", {}), got.get("families", {})
        for name in sorted(fams.keys() | have.keys()):
            if name not in have:
                out.append(Difference(endpoint, "missing", name, fams[name], None))
            elif name not in fams:
                out.append(Difference(endpoint, "extra", name, None, have[name]))
            else:
                if fams[name]["type"] != have[name]["type"]:
                    out.append(
                        Difference(endpoint, "type", name, fams[name]["type"], have[name]["type"])
                    )
                if fams[name]["labels"] != have[name]["labels"]:
                    out.append(
                        Difference(
                            endpoint, "labels", name, fams[name]["labels"], have[name]["labels"]
                        )
                    )
    return out


@contextmanager
def leveret_scrape() -> Iterator[dict[str, Any]]:
    """The workload on an in-process Leveret (with a data dir, as a real broker has),
    and its endpoints scraped."""
    from leveret.config import ServerConfig
    from leveret.testing import embedded_broker

    with tempfile.TemporaryDirectory() as data_dir:
        config = ServerConfig(
            port=0, data_dir=data_dir, management_port=None, prometheus_port=0,
            auth_failure_delay=0.05,
        )  # fmt: skip
        with embedded_broker(config) as broker:
            connections = workload.run(broker.url)
            try:
                yield scrape(f"http://127.0.0.1:{broker.server.prometheus.port}")
            finally:
                for conn in connections:
                    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="print allowed differences too")
    args = parser.parse_args(argv)
    with leveret_scrape() as actual:
        diffs = differences(recording(), actual)
    left, _used = split_allowed(diffs, ALLOWED)
    for diff in diffs if args.all else left:
        print(diff)
    print(f"{len(diffs)} differences, {len(left)} not allowed")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
