"""Tests for `leveret perf` (src/leveret/perf).

End-to-end tests run the tool against the in-process broker from the `leveret_broker`
fixture. Set LEVERET_PERF_TEST_URI (e.g. amqp://guest:guest@127.0.0.1:5673/%2F) to point
the same tests at another broker, such as the reference RabbitMQ. Assertions are about
shape and sanity, never about speed.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import pika
import pytest
from pamqp import commands, frame

from leveret.perf import main
from leveret.perf.amqp import ConfirmTracker
from leveret.perf.options import parse_uri
from leveret.perf.runner import consumer_queues, encode_message
from leveret.perf.stats import LatencySamples, percentile


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    override = os.environ.get("LEVERET_PERF_TEST_URI")
    if override:
        return override
    return request.getfixturevalue("leveret_broker")


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)  # stdout must be exactly one JSON object


def assert_sane(result: dict[str, Any]) -> None:
    assert result["errors"] == []
    assert result["ok"] is True
    assert result["window_s"] > 0
    for key in ("published", "confirmed", "nacked", "consumed"):
        assert result[key] >= 0
        assert result[f"{key}_per_s"] >= 0
    lat = result["latency_ms"]
    if lat["samples"]:
        assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]


# -- end to end ---------------------------------------------------------------------------


def test_json_summary_counts_traffic(broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 s so that the once-a-second timeline tick fires well inside the run.
    code, result = run_json(capsys, "--uri", broker_url, "--duration", "2")
    assert code == 0
    assert_sane(result)
    assert result["published"] > 0
    assert result["consumed"] > 0
    assert result["confirmed"] == 0  # confirms are off by default
    assert result["latency_ms"]["samples"] > 0
    assert result["config"]["queues"] == ["perf.q0"]
    assert result["timeline"], "per-second entries are recorded even in --json mode"


def test_quorum_queues(broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--queue-type quorum declares the queues as quorum queues (the cluster benchmark
    runs S2 on quorum queues against RabbitMQ's)."""
    name = f"perf.quorum.{os.getpid()}."
    code, result = run_json(
        capsys,
        *("--uri", broker_url, "--duration", "1", "--persistent", "--confirm", "100"),
        *("--queue-type", "quorum", "--queue-name", name, "--keep"),
    )
    assert code == 0
    assert_sane(result)
    assert result["confirmed"] > 0 and result["consumed"] > 0
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        ch.queue_declare(name + "0", durable=True, passive=False)  # it is not classic
    conn.channel().queue_delete(name + "0")
    conn.close()


def test_confirm_mode_reports_confirms(broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run_json(
        capsys,
        "--uri",
        broker_url,
        "--duration",
        "1",
        "--persistent",
        "--confirm",
        "100",
        "--quiet",
    )
    assert code == 0
    assert_sane(result)
    assert result["confirmed"] > 0
    assert result["nacked"] == 0
    # A window of 100 bounds how far publishing may run ahead of confirms.
    assert result["published"] - result["confirmed"] <= 100 + result["confirmed"]


def test_fanout_and_autoack(broker_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run_json(
        capsys,
        "--uri",
        broker_url,
        "--duration",
        "1",
        "--fanout",
        "3",
        "--consumers",
        "3",
        "--autoack",
        "--queue-name",
        "perf.fan.",
        "--quiet",
    )
    assert code == 0
    assert_sane(result)
    assert result["config"]["queues"] == ["perf.fan.0", "perf.fan.1", "perf.fan.2"]
    assert result["consumed"] > 0


def test_human_output_has_live_lines_and_summary(
    broker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--uri", broker_url, "--duration", "1.5", "--rate", "200", "--size", "64"])
    out = capsys.readouterr().out
    assert code == 0
    assert "published/s" in out and "consumed/s" in out
    assert "leveret perf summary" in out
    assert "errors      none" in out


def test_broker_channel_error_is_reported(
    broker_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redeclaring a transient queue as durable makes the broker close the channel (406)."""
    name = "perf.clash."
    base = ["--uri", broker_url, "--duration", "0.5", "--queue-name", name, "--quiet"]
    code, first = run_json(capsys, *base, "--keep")
    assert code == 0, first["errors"]
    try:
        code, second = run_json(capsys, *base, "--persistent")
        assert code == 1
        assert second["ok"] is False
        assert any("406" in e and "PRECONDITION_FAILED" in e for e in second["errors"])
    finally:
        # Clean up the kept transient queue: a plain run declares it again and deletes it.
        assert main([*base, "--producers", "0"]) == 0
        capsys.readouterr()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_broker_fails_with_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = main(["--uri", f"amqp://guest:guest@127.0.0.1:{port}/%2F", "--duration", "1"])
    err = capsys.readouterr().err
    assert code != 0
    assert f"127.0.0.1:{port}" in err
    assert "cannot connect" in err


def test_unreachable_broker_json_lists_error(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code, result = run_json(capsys, "--uri", f"amqp://127.0.0.1:{port}", "--duration", "1")
    assert code == 1
    assert result["ok"] is False
    assert any(f"127.0.0.1:{port}" in e for e in result["errors"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--size", "-1"],
        ["--producers", "0", "--consumers", "0"],
        ["--duration", "0"],
        ["--rate", "-5"],
        ["--fanout", "2", "--queues", "3"],
        ["--uri", "http://example.com/"],
        ["--prefetch", "70000"],
        ["--prefetch", "10", "--multi-ack-every", "10"],
        ["--queue-type", "quorum"],
        ["--queue-type", "stream", "--persistent"],
    ],
)
def test_invalid_flags_are_argparse_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


# -- units --------------------------------------------------------------------------------


def test_parse_uri_defaults_and_vhost() -> None:
    a = parse_uri("amqp://u:p%40ss@example.org:5999/my%2Fvhost")
    assert (a.host, a.port, a.user, a.password, a.vhost) == (
        "example.org",
        5999,
        "u",
        "p@ss",
        "my/vhost",
    )
    b = parse_uri("amqp://localhost")
    assert (b.port, b.user, b.password, b.vhost) == (5672, "guest", "guest", "/")
    assert parse_uri("amqp://h/%2F").vhost == "/"


def test_encoded_message_is_valid_amqp() -> None:
    prefix, suffix = encode_message("ex", "rk", 300, True, frame_max=128)
    assert suffix is not None
    data = prefix + (12345).to_bytes(8, "big") + suffix
    frames = []
    while data:
        used, channel, obj = frame.unmarshal(data)
        frames.append(obj)
        assert channel == 1
        data = data[used:]
    assert isinstance(frames[0], commands.Basic.Publish)
    assert frames[0].exchange == "ex" and frames[0].routing_key == "rk"
    assert frames[1].body_size == 300
    assert frames[1].properties.delivery_mode == 2
    bodies = [f.value for f in frames[2:]]
    assert len(bodies) > 1, "a 300 B body must be split with frame_max 128"
    body = b"".join(bodies)
    assert len(body) == 300 and int.from_bytes(body[:8], "big") == 12345
    whole, none = encode_message("", "q", 4, False, frame_max=131072)
    assert none is None and whole.endswith(b"x" * 4 + b"\xce")


def test_confirm_tracker_handles_multiple_and_out_of_order() -> None:
    t = ConfirmTracker()
    t.on_confirm(3, 0, False)  # ahead of the watermark
    t.on_confirm(1, 0, False)
    assert (t.confirmed, t.low) == (2, 1)
    t.on_confirm(5, 1, False)  # covers 2, 4, 5 (3 already counted)
    assert (t.confirmed, t.low, t.ahead) == (5, 5, set())
    t.on_confirm(5, 0, False)  # duplicate is ignored
    t.on_confirm(7, 1, True)
    assert (t.confirmed, t.nacked, t.low) == (5, 2, 7)


def test_latency_samples_stay_bounded_and_uniform() -> None:
    s = LatencySamples(cap=1000)
    for chunk in range(100):
        s.add(list(range(chunk * 100, chunk * 100 + 100)))
    assert len(s.samples) <= 1000
    assert s.seen == 10_000 and s.max == 9_999
    summary = s.summary()
    assert summary["samples"] == 10_000
    # Uniform subsample: the median stays near the true median (4999.5 ns).
    assert abs(percentile(sorted(s.samples), 50) - 5000) < 200


def test_consumers_cover_every_queue() -> None:
    qs = ["a", "b", "c"]
    assert consumer_queues(1, qs) == [["a", "b", "c"]]
    assert consumer_queues(2, qs) == [["a", "c"], ["b"]]
    assert consumer_queues(4, qs) == [["a"], ["b"], ["c"], ["a"]]


def test_perf_help_lists_the_flags():
    """`leveret perf --help` must render (a stray % in a help text once broke it)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "leveret", "perf", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "--confirm" in out.stdout and "%2F" in out.stdout
