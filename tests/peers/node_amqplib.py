"""Run Node amqplib's own mocha tests against Leveret (and RabbitMQ).

amqplib 0.10.9 ships its tests in the npm package. Three of its files talk to a
broker: ``test/channel_api.js``, ``test/callback_api.js`` and ``test/connect.js``
(76 tests). They read the broker's URL from ``URL``; a few tests in connect.js dial
the default ``localhost:5672`` instead, so ``amqplib_preload.js`` (ours) sends a
connection to 127.0.0.1:5672 to ``AMQPLIB_TEST_PORT`` (the IPv6 test's ``[::1]:5672``
is left alone: it fails on both brokers here).

The package is fetched with ``npm pack`` (pinned by its sha512 integrity) into
``.cache/peers/amqplib-0.10.9`` with mocha and amqplib's two runtime dependencies;
nothing of it is committed.

    python tests/peers/node_amqplib.py --fetch            # download only (install-test-deps)
    python tests/peers/node_amqplib.py                    # against a fresh Leveret
    python tests/peers/node_amqplib.py --rabbitmq amqp://guest:guest@127.0.0.1:5675/%2F

prints passed / failed for each broker and every failure. amqplib reports a frame
on a channel it has closed ("Frame on unknown channel") on stderr without failing
a test, so the output is searched for it too.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "peers"
HERE = Path(__file__).resolve().parent
PRELOAD = HERE / "amqplib_preload.js"

VERSION = "0.10.9"
INTEGRITY = "sha512-jwSftI4QjS3mizvnSnOrPGYiUnm1vI2OP1iXeOUz5pb74Ua0nbf6nPyyTzuiCLEE3fMpaJORXh2K/TQ08H5xGA=="
# mocha as amqplib's package.json asks (^9.2.2), and its runtime dependencies
DEV_PACKAGES = ("mocha@9.2.2", "buffer-more-ints@1.0.0", "url-parse@1.5.10")
TEST_FILES = ("test/channel_api.js", "test/callback_api.js", "test/connect.js")

#: tests that fail for a reason we accept, with it (docs/differences.md has the line)
EXPECTED_FAILURES = {
    "Connect API ipv6": "dials [::1]:5672; no broker listens there (fails on RabbitMQ too)",
}
#: only against Leveret
LEVERET_DIFFERENCES = {
    "Connect API serverProperties": (
        "asserts server_properties.product == 'RabbitMQ'; Leveret says 'Leveret' "
        "(docs/differences.md#amqp-server-product)"
    ),
}


@dataclass
class Result:
    broker: str
    passed: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # full title → first line
    unknown_channel_frames: int = 0

    def unexpected(self, leveret: bool) -> list[str]:
        allowed = dict(EXPECTED_FAILURES)
        if leveret:
            allowed.update(LEVERET_DIFFERENCES)
        return [name for name in self.failed if name not in allowed]


def node_available() -> bool:
    return shutil.which("node") is not None and shutil.which("npm") is not None


def fetch() -> Path:
    """amqplib's package with mocha installed beside it, once; its directory."""
    target = CACHE / f"amqplib-{VERSION}"
    if (target / "node_modules" / ".bin" / "mocha").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            ["npm", "pack", "--silent", f"amqplib@{VERSION}"],
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        archive = Path(tmp) / f"amqplib-{VERSION}.tgz"
        digest = (
            "sha512-" + base64.b64encode(hashlib.sha512(archive.read_bytes()).digest()).decode()
        )
        if digest != INTEGRITY:
            raise RuntimeError(f"{archive.name}: integrity {digest} is not the pinned {INTEGRITY}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(Path(tmp) / "package"), target)
    subprocess.run(
        [
            "npm",
            "install",
            "--silent",
            "--no-save",
            "--no-package-lock",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            *DEV_PACKAGES,
        ],
        cwd=target,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return target


def run(host: str, port: int, broker: str, user: str = "guest", password: str = "guest") -> Result:
    source = fetch()
    env = dict(os.environ)
    env["URL"] = f"amqp://{user}:{password}@{host}:{port}"
    env["AMQPLIB_TEST_PORT"] = str(port)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run(
            [
                str(source / "node_modules" / ".bin" / "mocha"),
                "--require",
                str(PRELOAD),
                "--check-leaks",
                "-u",
                "tdd",
                "--exit",
                "--timeout",
                "10000",
                "-R",
                "json",
                "--reporter-option",
                f"output={report}",
                *TEST_FILES,
            ],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if not report.exists():
            raise RuntimeError(f"mocha wrote no report: {proc.stderr[-2000:]}")
        data = json.loads(report.read_text())
    result = Result(broker, passed=data["stats"]["passes"])
    for failure in data["failures"]:
        message = (failure.get("err") or {}).get("message", "")
        result.failed[failure["fullTitle"]] = message.splitlines()[0] if message else ""
    result.unknown_channel_frames = (proc.stdout + proc.stderr).count("Frame on unknown channel")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch", action="store_true", help="only download amqplib and mocha")
    parser.add_argument("--rabbitmq", metavar="URL", help="also run against this broker")
    args = parser.parse_args(argv)
    if args.fetch:
        print(fetch())
        return 0
    sys.path.insert(0, str(HERE.parent))
    from suites import leveret_broker

    results = []
    with leveret_broker() as (host, port):
        results.append((run(host, port, "Leveret"), True))
    if args.rabbitmq:
        u = urlparse(args.rabbitmq)
        results.append(
            (
                run(
                    u.hostname or "127.0.0.1",
                    u.port or 5672,
                    "RabbitMQ",
                    u.username or "guest",
                    u.password or "guest",
                ),
                False,
            )
        )
    bad = 0
    for result, leveret in results:
        print(
            f"amqplib {VERSION} {result.broker:9} passed {result.passed:3d} "
            f"failed {len(result.failed):2d}; 'Frame on unknown channel' "
            f"{result.unknown_channel_frames} times"
        )
        unexpected = result.unexpected(leveret)
        for name, message in result.failed.items():
            print(f"    {'UNEXPECTED' if name in unexpected else 'expected'}: {name}: {message}")
        bad += len(unexpected) + result.unknown_channel_frames
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
