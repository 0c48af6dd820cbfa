"""Run real clients' own integration suites against Leveret (and RabbitMQ).

Leveret's own tests share the blind spots of the people who wrote the broker.
These suites were written by the clients' authors, against RabbitMQ:

* py-amqp 5.4.2, ``t/integration``;
* kombu 5.7.0, ``t/integration/test_py_amqp.py`` (the py-amqp transport).

Each suite comes from the package's source distribution on PyPI (CI reaches
package registries, not source hosting), pinned by version and sha256, and is
unpacked under ``.cache/peers``.  Each run gets a fresh Leveret broker
subprocess, because the suites leave queues behind (kombu's priority test
fails on its second run against any broker).

    python tests/peers/suites.py                       # against Leveret
    python tests/peers/suites.py --rabbitmq amqp://guest:guest@127.0.0.1:5673/%2F

prints passed / failed / skipped (errors count as failed) for each suite.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from serverproc import server_argv

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "peers"


@dataclass(frozen=True)
class Suite:
    name: str
    package: str
    version: str
    sha256: str
    tests: tuple[str, ...]
    # Tests that cannot pass against either broker here, with the reason.  A
    # failure outside this list is a Leveret bug (or a RabbitMQ difference to
    # document).
    expected_failures: dict[str, str] = field(default_factory=dict)
    deselect: dict[str, str] = field(default_factory=dict)


_TLS = "needs RabbitMQ's TLS listener on 5671 with the suite's certificates; fails on both brokers"

SUITES = (
    Suite(
        name="py-amqp",
        package="amqp",
        version="5.4.2",
        sha256="9362660c4a31150cf18e78cae2ce8aa1e929fc6c6739e69f6dd5dbea9c3edc82",
        tests=("t/integration",),
        expected_failures={
            "test_connect[tls]": _TLS,
            "test_tls_connect_fails": _TLS,
            "test_tls_default_certs": _TLS,
            "test_tls_no_default_certs_fails": _TLS,
            # the TLS fixture's setup errors for each test of the TLS class
            "tls": _TLS,
        },
    ),
    Suite(
        name="kombu (py-amqp transport)",
        package="kombu",
        version="5.7.0",
        sha256="31e62fdfd2381caa3422f8e02b84a491d9a2180ddda74507b57f4cb1e1c2c2c9",
        tests=("t/integration/test_py_amqp.py",),
    ),
)


@dataclass
class Result:
    suite: str
    broker: str
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0

    def unexpected(self, suite: Suite) -> list[str]:
        """Failures not explained by `expected_failures` (matched by substring)."""
        return [
            name
            for name in self.failed
            if not any(known in name for known in suite.expected_failures)
        ]


def fetch(suite: Suite) -> Path:
    """Download and unpack the pinned sdist once; return its directory."""
    target = CACHE / f"{suite.package}-{suite.version}"
    if (target / "t").is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"{suite.package}-{suite.version}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                str(CACHE),
                f"{suite.package}=={suite.version}",
            ],
            check=True,
        )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != suite.sha256:
        archive.unlink()
        raise RuntimeError(f"{archive.name}: sha256 {digest} is not the pinned {suite.sha256}")
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def leveret_broker() -> Iterator[tuple[str, int]]:
    """A fresh Leveret subprocess with its own data directory."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [*server_argv(), "--port", str(port), "--data-dir", data],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Leveret did not start")
                time.sleep(0.1)
            yield "127.0.0.1", port
        finally:
            proc.terminate()
            proc.wait(10)


def _clean_rabbitmq(url: str) -> None:
    """Delete what the suites leave behind on a long-lived RabbitMQ (kombu's
    priority test reads a fixed queue name and fails if old messages are in it)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete("priority_requeue_test")
    finally:
        conn.close()


def run_suite(suite: Suite, host: str, port: int, broker: str) -> Result:
    source = fetch(suite)
    env = dict(os.environ)
    env.update(
        RABBITMQ_HOST=host,
        RABBITMQ_5672_TCP=str(port),
        RABBITMQ_5671_TCP="1",  # no TLS listener: the TLS tests fail fast
        PYTHONPATH=str(source),
    )
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:leveret",
                "-W",
                "ignore",
                "--timeout",
                "60",
                "--rootdir",
                str(source),
                f"--junitxml={report}",
                *(str(source / t) for t in suite.tests),
            ],
            cwd=source,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        result = Result(suite.name, broker)
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("skipped") is not None:
                result.skipped += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                result.failed.append(name)
            else:
                result.passed += 1
    return result


def run_all(rabbitmq_url: str | None = None) -> list[Result]:
    results = []
    for suite in SUITES:
        with leveret_broker() as (host, port):
            results.append(run_suite(suite, host, port, "Leveret"))
        if rabbitmq_url:
            _clean_rabbitmq(rabbitmq_url)
            parsed = urlparse(rabbitmq_url)
            assert unquote(parsed.path[1:] or "/") == "/", "the suites use the vhost /"
            results.append(
                run_suite(suite, parsed.hostname or "127.0.0.1", parsed.port or 5672, "RabbitMQ")
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rabbitmq", metavar="URL", help="also run against this broker")
    args = parser.parse_args(argv)
    results = run_all(args.rabbitmq)
    print(f"{'suite':28} {'broker':9} {'passed':>6} {'failed':>6} {'skipped':>7}")
    bad = 0
    for result in results:
        suite = next(s for s in SUITES if s.name == result.suite)
        print(
            f"{result.suite:28} {result.broker:9} {result.passed:6d} "
            f"{len(result.failed):6d} {result.skipped:7d}"
        )
        for name in result.failed:
            known = next((r for k, r in suite.expected_failures.items() if k in name), None)
            print(
                f"    {'expected' if known else 'UNEXPECTED'}: {name}"
                + (f" ({known})" if known else "")
            )
        if result.broker == "Leveret":
            bad += len(result.unexpected(suite))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
