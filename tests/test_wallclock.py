"""The broker's wall clock (`leveret.wallclock`) and its test hook, which the
partition harness's clock-jump nemesis uses to jump one node's clock."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import subprocess
import time

import pika
import pytest

from leveret import wallclock
from serverproc import server_argv


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    """wallclock reloaded with the hook on a file in tmp_path; plain again afterwards."""
    path = tmp_path / "clock"
    monkeypatch.setenv(wallclock.CLOCK_FILE_ENV, str(path))
    importlib.reload(wallclock)
    yield path
    monkeypatch.delenv(wallclock.CLOCK_FILE_ENV)
    importlib.reload(wallclock)


def _set(path, text: str) -> None:
    path.write_text(text)
    time.sleep(wallclock._RECHECK_S * 2)  # the hook looks at the file every 50 ms


def test_without_the_variable_the_clock_is_time_itself(monkeypatch):
    monkeypatch.delenv(wallclock.CLOCK_FILE_ENV, raising=False)
    importlib.reload(wallclock)
    assert wallclock.time is time.time
    assert wallclock.time_ns is time.time_ns


def test_the_file_moves_the_clock_forward_and_back(hooked):
    assert abs(wallclock.time() - time.time()) < 1  # no file yet: no offset
    _set(hooked, "3600")
    assert 3599 < wallclock.time() - time.time() < 3601
    assert 3599e9 < wallclock.time_ns() - time.time_ns() < 3601e9
    assert 3599 < wallclock.now_utc().timestamp() - time.time() < 3601
    _set(hooked, "-7200.5")
    assert -7201.5 < wallclock.time() - time.time() < -7199.5
    _set(hooked, "not a number")  # half written: the last offset stays
    assert -7201.5 < wallclock.time() - time.time() < -7199.5
    hooked.unlink()
    time.sleep(wallclock._RECHECK_S * 2)
    assert abs(wallclock.time() - time.time()) < 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _broker(tmp_path, clock_file):
    port = _free_port()
    env = {**os.environ, wallclock.CLOCK_FILE_ENV: str(clock_file)}
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [*server_argv(), "--port", str(port), "--data-dir", str(tmp_path / "data")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "server.log"
            ).read_text()
            time.sleep(0.1)
        yield f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    finally:
        proc.terminate()
        proc.wait(30)


def _first_offset(ch, queue: str) -> int | None:
    ch.basic_qos(prefetch_count=1)
    for method, props, _body in ch.consume(
        queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=2
    ):
        ch.cancel()
        if method is None:
            return None
        return props.headers["x-stream-offset"]
    return None


@pytest.mark.leveret_only
def test_a_node_clock_jumped_ahead_past_max_age_drops_a_streams_old_segments(tmp_path):
    """Stream retention by age reads the broker's wall clock: a node whose clock jumps
    ahead by more than `x-max-age` drops the old segments of confirmed messages at
    its next segment roll, as any broker whose clock jumped would; a clock that jumps
    back by as much drops nothing."""
    clock = tmp_path / "clock"
    with _broker(tmp_path, clock) as url:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        args = {"x-queue-type": "stream", "x-max-age": "1h"}
        args["x-stream-max-segment-size-bytes"] = 4096
        ch.queue_declare("wallclock-stream", durable=True, arguments=args)

        def publish(n: int) -> None:
            for i in range(n):
                ch.basic_publish("", "wallclock-stream", b"x" * 500 + str(i).encode())

        publish(40)  # several segments
        assert _first_offset(ch, "wallclock-stream") == 0
        _set(clock, "-7200")
        publish(20)  # records two hours back: nothing is older than an hour
        assert _first_offset(ch, "wallclock-stream") == 0
        _set(clock, "7200")
        publish(20)  # rolls a segment: every closed one is more than an hour old
        first = _first_offset(ch, "wallclock-stream")
        assert first is not None and first > 0
        conn.close()
