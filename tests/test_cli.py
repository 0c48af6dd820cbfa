"""The ``leveret`` command line: ``leveret server`` as a real subprocess."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pika
import pika.exceptions
import pytest

from serverproc import server_argv

pytestmark = pytest.mark.leveret_only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate(timeout=5)
            pytest.fail(f"server exited early ({proc.returncode}):\n{out}\n{err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("server did not start listening")


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [
            *server_argv(),
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_listening(proc, port)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_help():
    result = subprocess.run(
        [sys.executable, "-m", "leveret", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert "server" in result.stdout


def test_server_help():
    result = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert "--port" in result.stdout
    assert "--data-dir" in result.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_closes_clients_and_exits_zero(server, sig):
    proc, port = server
    params = pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hello")
    assert ch.basic_get(q, auto_ack=True)[2] == b"hello"

    proc.send_signal(sig)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(200):
            conn.process_data_events(time_limit=0.05)
    assert info.value.reply_code == 320
    assert info.value.reply_text.startswith("CONNECTION_FORCED")
    assert proc.wait(timeout=20) == 0


def test_data_dir_is_created(server, tmp_path):
    proc, port = server
    assert (tmp_path / "data").exists()


@pytest.mark.leveret_only
@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--port", "99999"], "port must be 0-65535"),
        (["--port", "abc"], "expected a whole number"),
        (["--fsync", "sometimes"], "invalid choice: 'sometimes'"),
        (["--log-level", "loud"], "invalid choice: 'loud'"),
        (["--max-memory-bytes", "-5"], "must not be negative"),
        (["--queue-ram-messages", "-1"], "must not be negative"),
        (["--queue-ram-messages", "many"], "expected a whole number"),
        (["--frame-max", "100"], "--frame-max must be at least 4096"),
        (["--consumer-timeout-ms", "-1"], "must not be negative"),
        (["--memory-high-watermark", "lots"], "expected a whole number"),
        (["--disk-free-limit", "-10"], "must not be negative"),
        (["--heartbeat", "1.5"], "expected a whole number"),
        (["--listen", "5672"], "expected HOST:PORT, got '5672'"),
        (["--listen", "::1:5672"], "an IPv6 address needs brackets: [::1]:5672"),
        (["--listen", "[::1]5672"], "expected [IPV6]:PORT"),
        (["--listen", "127.0.0.1:99999"], "bad port in '127.0.0.1:99999'"),
        (["--listen", "127.0.0.1:x"], "bad port in '127.0.0.1:x'"),
        (["--queue-ram-bytes", "-5"], "must not be negative"),
        (["--busy-wait-us", "-200"], "must not be negative"),
        (["--busy-wait-us", "2ms"], "expected a whole number, got '2ms'"),
        (["--queue-ram-bytes", "lots"], "expected a whole number"),
        (["--quorum-delivery-limit", "-1"], "must not be negative"),
        (["--quorum-delivery-limit", "x"], "expected a whole number"),
        (["--cluster-etcd", "notaurl"], "expected http://HOST:PORT"),
        (["--cluster-etcd", "ftp://etcd:2379"], "got 'ftp://etcd:2379'"),
        (["--cluster-etcd", ","], "expected http://HOST:PORT"),
        (["--cluster-min-replicas", "-1"], "must not be negative"),
        (["--cluster-lease-seconds", "0.5"], "must be at least 1 second"),
        (["--cluster-lease-seconds", "soon"], "expected a number of seconds"),
        (["--cluster-port", "abc"], "expected a whole number"),
        (["--cluster-advertise", "proxy"], "expected HOST:PORT, got 'proxy'"),
    ],
)
def test_bad_server_flags_name_the_problem(args, fragment, tmp_path):
    proc = subprocess.run(
        [*server_argv(), "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert fragment in proc.stderr


@pytest.mark.leveret_only
def test_port_in_use_is_reported(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                *server_argv(),
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "d"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr and str(port) in proc.stderr
    assert "pick free ports with --port" in proc.stderr


@pytest.mark.parametrize("etcd", ["refuses", "silent"])
def test_cluster_node_stops_on_sigterm_while_etcd_is_away(etcd, tmp_path):
    """A node whose etcd is down (nothing listens) or hung (accepts, never answers)
    retries its registration, and a SIGTERM still stops it, with status 0. Before,
    the retry loop ran before the signal was looked at: only SIGKILL ended it."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        etcd_port = hung.getsockname()[1]
        if etcd == "silent":
            hung.listen(16)  # connections are accepted by the kernel, never answered
        else:
            hung.close()  # the port is free: connections are refused
        log = tmp_path / "server.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [
                    *server_argv(),
                    "--port",
                    str(_free_port()),
                    "--management-port",
                    "0",
                    "--prometheus-port",
                    "0",
                    "--data-dir",
                    str(tmp_path / "d"),
                    "--cluster-etcd",
                    f"http://127.0.0.1:{etcd_port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        try:
            if etcd == "silent":
                # The node's first request is under way (and will never be answered).
                hung.settimeout(60)
                request, _ = hung.accept()
            else:
                deadline = time.monotonic() + 60
                while "cannot register with etcd yet" not in log.read_text():
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, "no etcd attempt:\n" + log.read_text()
                    time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = log.read_text()
    assert "stopped before it could register with etcd" in text
    assert "Traceback" not in text
