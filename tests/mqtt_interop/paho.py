"""Run the Eclipse Paho MQTT interoperability suite against a broker; print JSON.

    python -m tests.mqtt_interop.paho --host 127.0.0.1 --port 1884 \\
        [--version 3.1.1 --version 5] [--paho DIR] [--only GLOB] [--output FILE]

The suite (github.com/eclipse/paho.mqtt.testing, `interoperability/client_test.py`
for MQTT 3.1.1 and `client_test5.py` for MQTT 5.0) is not ours and is never
committed here. Its checkout is, in order: `--paho DIR`, the environment variable
LEVERET_PAHO_DIR, or the commit PINNED exported from the git mirror MIRROR (what
the `fetch` of the repository leaves) into a temporary directory. DIR is the
repository root (the folder that holds `interoperability/`).

The suite's own command line cannot be used as it is (its `unittest.main()` reads the
host option it does not remove, and `setUpClass` resets the topics), so each test
runs in its own Python process that imports the suite's module, sets its globals
(host, port, topics) and runs that one test: a test that hangs is killed after
`--test-timeout` seconds and counted as `timeout`, and no test sees a client left
connected by the one before. Between tests, and after the last one, the runner
removes what the suite leaves on the broker (the sessions of its two client ids,
its retained messages), so a shared broker is left clean.

The JSON printed (and written to --output) is
`{"paho_commit": ..., "broker": LABEL, "suites": {"3.1.1": {TEST: OUTCOME}, "5": {...}}}`
with OUTCOME one of `pass`, `fail`, `error`, `timeout`; `--details` adds, under "details", one
line per test that did not pass saying why (the exception its output shows).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: the commit of github.com/eclipse/paho.mqtt.testing the recorded results come from
PINNED = "9d7bb80bb8b9d9cfc0b52f8cb4c1916401281103"
#: where the `fetch` tool leaves the repository (a bare git directory)
MIRROR = Path("/work/.mirror/eclipse+paho.mqtt.testing/repo")
ENV = "LEVERET_PAHO_DIR"

#: suite name -> (module in interoperability/, MQTT protocol level)
SUITES = {"3.1.1": ("client_test", 4), "5": ("client_test5", 5)}

#: the suite's topics, as its `__main__` sets them (its setData() resets them to these)
TOPICS = ["TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA"]
WILDTOPICS = ["TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#"]
NOSUBSCRIBE = ["test/nosubscribe"]
#: client_test5's prefix for its shared-subscription topics
TOPIC_PREFIX = "client_test5/"
#: the client ids the suite opens sessions for (its cleanup() names the first two)
CLIENT_IDS = ["myclientid", "myclientid2", "clean retained"]


class Unavailable(Exception):
    """The Paho checkout cannot be found or made; the message says why."""


def _bootstrap() -> str:
    """The child's program: import the suite, set its globals, run one test, write the
    outcome as JSON to the result file (stdout belongs to the suite's prints)."""
    return (
        "import json, sys, unittest\n"
        "module_name, host, port, test, out, data = sys.argv[1:7]\n"
        "sys.argv = [sys.argv[0]]\n"
        "sys.path.insert(0, '.')\n"
        "module = __import__(module_name)\n"
        "data = json.loads(data)\n"
        "module.host, module.port = host, int(port)\n"
        "module.topics, module.wildtopics = data['topics'], data['wildtopics']\n"
        "module.nosubscribe_topics = data['nosubscribe']\n"
        "module.topic_prefix = data['prefix']\n"
        "if test == '--list':\n"
        "    names = unittest.TestLoader().getTestCaseNames(module.Test)\n"
        "    open(out, 'w').write(json.dumps(list(names)))\n"
        "    sys.exit(0)\n"
        "result = unittest.TestResult()\n"
        "unittest.TestSuite([module.Test(test)]).run(result)\n"
        "outcome = 'pass'\n"
        "if result.failures: outcome = 'fail'\n"
        "if result.errors: outcome = 'error'\n"
        "if result.testsRun == 0: outcome = 'error'\n"
        "text = ''.join(t for _c, t in result.failures + result.errors)\n"
        "open(out, 'w').write(json.dumps({'outcome': outcome, 'text': text}))\n"
        "sys.stdout.flush()\n"
        "import os; os._exit(0)\n"  # the suite's receiver threads are not daemons
    )


def _data() -> str:
    return json.dumps(
        {
            "topics": TOPICS,
            "wildtopics": WILDTOPICS,
            "nosubscribe": NOSUBSCRIBE,
            "prefix": TOPIC_PREFIX,
        }
    )


@contextmanager
def checkout(paho: str | None = None) -> Iterator[tuple[Path, str]]:
    """(the repository root, its commit or "unknown") from --paho, LEVERET_PAHO_DIR or
    the mirror at PINNED; raises Unavailable saying which was tried."""
    given = paho or os.environ.get(ENV)
    if given:
        root = Path(given)
        if not (root / "interoperability" / "client_test.py").is_file():
            raise Unavailable(
                f"Paho checkout unavailable: {root}/interoperability/client_test.py not found"
            )
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        yield root, commit or "unknown"
        return
    if not MIRROR.is_dir():
        raise Unavailable(
            f"Paho checkout unavailable: no --paho DIR, no {ENV}, no git mirror at {MIRROR}"
        )
    tmp = Path(tempfile.mkdtemp(prefix="paho-"))
    try:
        archive = subprocess.run(
            ["git", "--git-dir", str(MIRROR), "archive", PINNED, "interoperability"],
            capture_output=True,
        )
        if archive.returncode != 0:
            raise Unavailable(
                f"Paho checkout unavailable: the mirror {MIRROR} has no commit {PINNED}: "
                + archive.stderr.decode(errors="replace").strip()
            )
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        yield tmp, PINNED
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _child(root: Path, module: str, host: str, port: int, test: str, timeout: float):
    """Run the bootstrap for one test (or `--list`): (the JSON it wrote or None, the
    output's tail, timed out)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    out.write_text("")
    argv = [sys.executable, "-c", _bootstrap(), module, host, str(port), test, str(out), _data()]
    proc = subprocess.Popen(
        argv,
        cwd=root / "interoperability",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        timed_out = True
    text = out.read_text()
    out.unlink()
    tail = "\n".join(output.decode(errors="replace").splitlines()[-40:])
    return (json.loads(text) if text else None), tail, timed_out


def list_tests(root: Path, suite: str, host: str, port: int) -> list[str]:
    module, _level = SUITES[suite]
    names, tail, _ = _child(root, module, host, port, "--list", 60)
    if names is None:
        raise Unavailable(f"Paho checkout unusable: listing {module} failed:\n{tail}")
    return names


# --- leaving the broker clean ------------------------------------------------------------


def _packet(kind: int, body: bytes) -> bytes:
    n, length = len(body), b""
    while True:
        byte, n = n % 128, n // 128
        length += bytes([byte | (0x80 if n else 0)])
        if not n:
            return bytes([kind]) + length + body


def _utf8(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _connect_clean(host: str, port: int, client_id: str) -> socket.socket | None:
    """An MQTT 3.1.1 connection with clean session (which drops the id's stored
    session), or None where the broker does not accept it."""
    body = _utf8("MQTT") + bytes([4, 0x02]) + (30).to_bytes(2, "big") + _utf8(client_id)
    try:
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(_packet(0x10, body))
        connack = sock.recv(4)
    except OSError:
        return None
    if len(connack) < 4 or connack[0] != 0x20 or connack[3] != 0:
        sock.close()
        return None
    return sock


def clean_broker(host: str, port: int) -> None:
    """Drop the suite's sessions (a clean-session connect and DISCONNECT per client id)
    and its retained messages (an empty retained publish to each topic it uses)."""
    for client_id in CLIENT_IDS:
        sock = _connect_clean(host, port, client_id)
        if sock is None:
            continue
        if client_id == CLIENT_IDS[0]:
            topics = TOPICS + [TOPIC_PREFIX + t for t in TOPICS] + ["fromb/qos 0", "fromb/qos 1"]
            for topic in topics:
                sock.sendall(_packet(0x31, _utf8(topic)))  # QoS 0, retain, empty payload
        sock.sendall(b"\xe0\x00")
        time.sleep(0.1)
        sock.close()


# --- running ------------------------------------------------------------------------------


#: " at 0x7f..." in a repr: differs from run to run
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.*)$")


def reason(outcome: str, text: str, tail: str) -> str:
    """One line on why a test did not pass: the most telling exception its output
    shows first (the suite wraps most failures in `assert succeeded`, and later
    exceptions are mostly what the first left behind)."""
    if outcome == "timeout":
        return "timeout"
    found = []
    for line in (text + "\n" + tail).splitlines():
        match = _EXCEPTION.match(line.strip())
        if match and match.group(2) != "False != True":
            found.append(_ADDRESS.sub("", f"{match.group(1)}: {match.group(2)}")[:200])
    return found[0] if found else outcome


def run_suite(
    root: Path,
    suite: str,
    host: str,
    port: int,
    only: str | None = None,
    test_timeout: float = 120,
    details: dict[str, str] | None = None,
    progress: bool = False,
) -> dict[str, str]:
    """{test name: outcome} for one suite ("3.1.1" or "5")."""
    module, _level = SUITES[suite]
    outcomes: dict[str, str] = {}
    for name in list_tests(root, suite, host, port):
        if only and not fnmatch.fnmatchcase(name, only):
            continue
        result, tail, timed_out = _child(root, module, host, port, name, test_timeout)
        if timed_out:
            outcome = "timeout"
        elif result is None:
            outcome = "error"
        else:
            outcome = result["outcome"]
        outcomes[name] = outcome
        if details is not None and outcome != "pass":
            details[f"{suite} {name}"] = reason(outcome, (result or {}).get("text", ""), tail)
        if progress:
            print(f"{suite} {name}: {outcome}", file=sys.stderr, flush=True)
        clean_broker(host, port)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="the broker's MQTT port")
    parser.add_argument("--paho", default=None, help=f"checkout root (default: ${ENV}, mirror)")
    parser.add_argument("--version", action="append", choices=sorted(SUITES), help="default: all")
    parser.add_argument("--only", default=None, help="tests whose name matches this glob")
    parser.add_argument("--test-timeout", type=float, default=120)
    parser.add_argument("--details", action="store_true", help="failed tests' output tails")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    parser.add_argument("--label", default=None, help="the broker, as the JSON names it")
    args = parser.parse_args(argv)
    try:
        with checkout(args.paho) as (root, commit):
            details: dict[str, str] = {}
            report: dict = {"paho_commit": commit, "broker": args.label, "suites": {}}
            for suite in args.version or sorted(SUITES):
                report["suites"][suite] = run_suite(
                    root, suite, args.host, args.port, args.only, args.test_timeout,
                    details if args.details else None, progress=True,
                )  # fmt: skip
            if args.details:
                report["details"] = details
    except Unavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    text = json.dumps(report, indent=1, sort_keys=True)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
