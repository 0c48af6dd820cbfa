"""The README's examples must keep working: run them against a broker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.leveret_only
def test_the_ten_line_pika_example_runs(leveret_broker, capsys):
    block = next(b for b in _python_blocks() if "basic_get" in b)
    assert len(block.strip().splitlines()) <= 10
    code = block.replace("amqp://guest:guest@127.0.0.1:5672/%2F", leveret_broker)
    exec(compile(code, "README.md", "exec"), {})
    assert "Hello, Leveret!" in capsys.readouterr().out


def test_readme_commands_match_ci():
    """The README's test command is one line, and CI runs exactly it."""
    text = README.read_text()
    section = text.split("## Run the tests", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert lines == ["bash scripts/test.sh"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec bash scripts/test.sh" in ci
    script = (README.parent / "scripts" / "test.sh").read_text()
    for step in (
        "bash scripts/install-test-deps.sh",
        "python -m pytest",
        "bash scripts/test-pure-python.sh",
    ):
        assert step in script


# -- the leveret.client examples ------------------------------------------------------------

README_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _client_blocks(marker: str) -> list[str]:
    blocks = [b for b in _python_blocks() if "leveret.client" in b and marker in b]
    assert len(blocks) == 2, f"expected an asyncio and a blocking example with {marker!r}"
    assert any("leveret.client.blocking" in b for b in blocks)
    return blocks


def _run_until(code: str, expected: list[str], timeout: float = 30.0) -> str:
    """Run an example that never ends by itself (a consumer) in a subprocess; stop it
    once every expected line was printed."""
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True
    ).start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            out = "".join(lines)
            if all(e in out for e in expected) or proc.poll() is not None:
                break
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(10)
    return "".join(lines)


def _queue_depth(url: str, queue: str) -> int:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


@pytest.mark.leveret_only
@pytest.mark.parametrize("index", [0, 1], ids=["asyncio", "blocking"])
def test_client_publish_example_runs(leveret_broker, index):
    block = _client_blocks('name="publisher"')[index]
    exec(compile(block.replace(README_URL, leveret_broker), "README.md", "exec"), {})
    assert _queue_depth(leveret_broker, "tasks") == 1


@pytest.mark.leveret_only
@pytest.mark.parametrize("index", [0, 1], ids=["asyncio", "blocking"])
def test_client_consume_example_runs(leveret_broker, index):
    import pika

    block = _client_blocks('consume("tasks"')[index]
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker))
    ch = conn.channel()
    ch.queue_declare("tasks", durable=True)
    for body in (b"first job", b"second job"):
        ch.basic_publish("", "tasks", body)
    conn.close()
    out = _run_until(block.replace(README_URL, leveret_broker), ["b'first job'", "b'second job'"])
    assert "b'first job'" in out and "b'second job'" in out, out


@pytest.mark.leveret_only
@pytest.mark.parametrize("index", [0, 1], ids=["asyncio", "blocking"])
def test_client_rpc_example_runs(leveret_broker, capsys, index):
    block = _client_blocks("rpc_call")[index]
    exec(compile(block.replace(README_URL, leveret_broker), "README.md", "exec"), {})
    assert "b'42'" in capsys.readouterr().out


def _stream_broker(request) -> str:
    """A broker with stream queues: Leveret once it has them, else the reference RabbitMQ."""
    from clienthelp import RABBITMQ_URL, broker_has_streams, rabbitmq_reachable

    url = request.getfixturevalue("leveret_broker")
    if broker_has_streams(url):
        return url
    if rabbitmq_reachable():
        return RABBITMQ_URL
    pytest.skip("no broker with stream queues (Leveret has none yet; RabbitMQ not reachable)")


@pytest.mark.parametrize("index", [0, 1], ids=["asyncio", "blocking"])
def test_client_stream_example_runs(request, index):
    import asyncio
    import uuid

    from leveret.client import connect

    url = _stream_broker(request)
    stream = f"readme-events-{uuid.uuid4().hex[:8]}"
    block = _client_blocks('offset="first"')[index]
    code = block.replace(README_URL, url).replace('"events"', f'"{stream}"')

    async def publish(n: int) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            await ch.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
            await ch.publish_many((b"event %d" % i for i in range(n)), routing_key=stream)

    async def delete() -> None:
        async with await connect(url) as conn:
            await (await conn.channel()).delete_queue(stream)

    asyncio.run(publish(3))
    try:
        out = _run_until(code, ["0 b'event 0'", "2 b'event 2'"])
        assert "0 b'event 0'" in out and "1 b'event 1'" in out and "2 b'event 2'" in out, out
    finally:
        asyncio.run(delete())
