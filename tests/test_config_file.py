"""The TOML configuration file: every setting, flags over the file, clear refusals."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pika
import pytest

from leveret.config import Listener
from leveret.config_file import ConfigFileError, load
from serverproc import server_argv

pytestmark = pytest.mark.leveret_only


def _write(tmp_path, text: str):
    path = tmp_path / "leveret.toml"
    path.write_text(text)
    return path


def test_every_kind_of_setting_loads(tmp_path):
    path = _write(
        tmp_path,
        """
data-dir = "data"
heartbeat = 30
fsync = "always"
auth_failure_delay = 0.5
loopback_users = []
default_user = "admin"
load_definitions = "defs.json"

[[listeners]]
host = "127.0.0.1"
port = 5672

[[listeners]]
host = "::1"
port = 5671
kind = "amqps"

[tls]
cert = "server.pem"
key = "server.key"
verify = true
""",
    )
    values = load(str(path))
    assert values["data_dir"] == str(tmp_path / "data")
    assert values["heartbeat"] == 30 and values["fsync"] == "always"
    assert values["auth_failure_delay"] == 0.5 and values["loopback_users"] == []
    assert values["default_user"] == "admin"
    assert values["load_definitions"] == str(tmp_path / "defs.json")
    assert values["listeners"] == [Listener("127.0.0.1", 5672), Listener("::1", 5671, "amqps")]
    assert values["tls_cert"] == str(tmp_path / "server.pem") and values["tls_verify"] is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("port = 1\nhost = = 2", "not valid TOML: Invalid value (at line 2, column 8)"),
        ("prot = 5672", "unknown key 'prot'; did you mean 'port'?"),
        ('port = "abc"', "key 'port': expected a whole number, got 'abc'"),
        ("port = 70000", "key 'port': a port is 0-65535, got 70000"),
        ("heartbeat = -1", "key 'heartbeat': must not be negative, got -1"),
        ("queue_ram_messages = -5", "key 'queue_ram_messages': must not be negative, got -5"),
        ("busy_wait_us = -200", "key 'busy_wait_us': must not be negative, got -200"),
        ('busy_wait_us = "2ms"', "key 'busy_wait_us': expected a whole number"),
        ('queue_ram_messages = "lots"', "key 'queue_ram_messages': expected a whole number, got 'lots'"),
        ('fsync = "sometimes"', "key 'fsync': expected one of always, batch, never, got 'sometimes'"),
        ("loopback_users = [1]", "key 'loopback_users': expected a list of strings, got [1]"),
        ("[tls]\ncertificate = 'x'", "unknown key 'tls.certificate'; known: cert, key, ca"),
        ("[[listeners]]\nhost = 'x'", "listeners[0] needs a port"),
        ("[[listeners]]\nport = 1\nkind = 'http'", "listeners[0].kind must be 'amqp' or 'amqps', got 'http'"),
    ],
)  # fmt: skip
def test_bad_files_name_the_key_and_the_reason(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigFileError) as info:
        load(str(path))
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(ConfigFileError, match="no such file"):
        load(str(tmp_path / "absent.toml"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str):
    proc = subprocess.Popen(
        [*server_argv(), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


def _wait(proc, port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("no listener")


def _stop(proc) -> str:
    proc.terminate()
    return proc.communicate(timeout=20)[1]


def test_the_server_runs_from_the_file(tmp_path):
    port = _free_port()
    path = _write(
        tmp_path,
        f'data_dir = "d"\ndefault_user = "ops"\ndefault_pass = "pw"\n'
        f'[[listeners]]\nhost = "127.0.0.1"\nport = {port}\n',
    )
    proc = _serve("--config", str(path))
    try:
        _wait(proc, port)
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials("ops", "pw")
            )
        )
        conn.close()
        assert os.path.exists(tmp_path / "d" / "ctl.sock")
    finally:
        _stop(proc)


def test_a_flag_overrides_the_file(tmp_path):
    file_port, flag_port = _free_port(), _free_port()
    path = _write(tmp_path, f'port = {file_port}\ndata_dir = "d"\nheartbeat = 7\n')
    proc = _serve("--config", str(path), "--port", str(flag_port))
    try:
        _wait(proc, flag_port)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", flag_port))
        assert conn._impl.params.heartbeat == 7  # from the file, as no flag set it
        conn.close()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", file_port)) != 0
    finally:
        _stop(proc)


def test_a_bad_file_stops_the_start_without_a_traceback(tmp_path):
    path = _write(tmp_path, "hearbeat = 5\n")
    result = subprocess.run(
        [*server_argv(), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        f"leveret server: bad config file: {path}: unknown key 'hearbeat'; did you mean 'heartbeat'?"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
