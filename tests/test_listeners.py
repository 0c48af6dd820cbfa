"""Listeners: IPv6, several addresses, `--listen`."""

from __future__ import annotations

import socket
import subprocess
import time

import pika
import pytest

from leveret.config import Listener, ServerConfig
from leveret.testing import EmbeddedBroker
from serverproc import server_argv

pytestmark = pytest.mark.leveret_only

HAS_IPV6 = socket.has_ipv6
try:
    with socket.socket(socket.AF_INET6) as _s:
        _s.bind(("::1", 0))
except OSError:
    HAS_IPV6 = False
needs_ipv6 = pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback on this machine")


def _round_trip(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hi")
    _m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hi"
    conn.close()


@needs_ipv6
def test_several_listeners_ipv4_and_ipv6():
    config = ServerConfig(
        persistence=False, listeners=[Listener("127.0.0.1", 0), Listener("::1", 0)]
    )
    broker = EmbeddedBroker(config).start()
    try:
        (h4, p4), (h6, p6) = broker.server.addresses
        assert (h4, h6) == ("127.0.0.1", "::1")
        _round_trip(f"amqp://guest:guest@127.0.0.1:{p4}/%2F")
        _round_trip(f"amqp://guest:guest@[::1]:{p6}/%2F")
    finally:
        broker.stop()


def _free_port(family=socket.AF_INET, host="127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_port(proc, family, host, port):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        with socket.socket(family) as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("broker did not listen")


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "::"])
def test_cli_host_ipv6(tmp_path, host):
    port = _free_port(socket.AF_INET6, "::1")
    proc = subprocess.Popen(
        [*server_argv(), "--host", host, "--port", str(port),
         "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_port(proc, socket.AF_INET6, "::1", port)
        _round_trip(f"amqp://guest:guest@[::1]:{port}/%2F")
    finally:
        proc.terminate()
        proc.wait(20)


@needs_ipv6
def test_cli_repeated_listen(tmp_path):
    p4, p6 = _free_port(), _free_port(socket.AF_INET6, "::1")
    proc = subprocess.Popen(
        [*server_argv(), "--listen", f"127.0.0.1:{p4}",
         "--listen", f"[::1]:{p6}", "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_port(proc, socket.AF_INET6, "::1", p6)
        _wait_port(proc, socket.AF_INET, "127.0.0.1", p4)
        _round_trip(f"amqp://guest:guest@127.0.0.1:{p4}/%2F")
        _round_trip(f"amqp://guest:guest@[::1]:{p6}/%2F")
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[1]
    assert f"listening for AMQP 0-9-1 on [::1]:{p6}" in out
    assert f"listening for AMQP 0-9-1 on 127.0.0.1:{p4}" in out


def test_second_listener_in_use_fails_and_releases_the_first(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = _free_port()
        proc = subprocess.run(
            [*server_argv(), "--listen", f"127.0.0.1:{free}",
             "--listen", f"127.0.0.1:{busy}", "--data-dir", str(tmp_path / "d")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr
    with socket.socket() as again:  # the first listener was closed, not leaked
        again.bind(("127.0.0.1", free))
