"""Busy waiting (`--busy-wait-us`, server/busy_wait.py): the loop polls instead of
sleeping after traffic, and nothing that shares the loop waits behind the polling.

No timing is asserted: the windows are long (hundreds of milliseconds) so that what the
tests check (a timer and another thread's callback run *while* the loop polls, and the
polling stops once traffic stops) holds on a slow, shared machine.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pika
import pytest

from leveret.config import ServerConfig
from leveret.server.busy_wait import BusyWait
from leveret.testing import EmbeddedBroker

pytestmark = pytest.mark.leveret_only


def _loops():
    loops = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, ("uvloop", uvloop.new_event_loop)]


@pytest.mark.parametrize("make_loop", [m for _, m in _loops()], ids=[n for n, _ in _loops()])
def test_timers_and_other_threads_run_while_the_loop_polls(make_loop):
    loop = make_loop()
    try:
        busy = BusyWait(loop, 400_000)  # 0.4 s
        seen: dict[str, bool] = {}

        def timer() -> None:
            seen["timer ran while polling"] = busy.spinning

        def from_thread() -> None:
            seen["threadsafe callback ran while polling"] = busy.spinning

        async def main() -> None:
            busy.arm()
            loop.call_later(0.01, timer)
            threading.Timer(0.02, loop.call_soon_threadsafe, (from_thread,)).start()
            while busy.spinning:  # until the window has passed with no new arm()
                await asyncio.sleep(0.05)

        loop.run_until_complete(asyncio.wait_for(main(), 30))
        assert seen == {
            "timer ran while polling": True,
            "threadsafe callback ran while polling": True,
        }
        assert busy.turns > 1  # it kept the loop turning, one callback a turn
        assert not busy.spinning  # and stopped once the window passed
    finally:
        loop.close()


def test_a_window_must_be_positive():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="busy_wait_us must be positive, got 0"):
            BusyWait(loop, 0)
    finally:
        loop.close()


def test_off_by_default():
    broker = EmbeddedBroker().start()
    try:
        assert broker.server.listener.busy_wait is None
    finally:
        broker.stop()


@pytest.fixture
def busy_broker(tmp_path):
    config = ServerConfig(port=0, data_dir=str(tmp_path / "data"), busy_wait_us=300_000)
    broker = EmbeddedBroker(config).start()
    yield broker
    broker.stop()


def test_persistent_confirmed_messages_flow_while_the_loop_polls(busy_broker):
    """The store's writer thread confirms through call_soon_threadsafe, and the
    consumer's reads arm the window again: every message arrives, confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(busy_broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare("busy", durable=True)
        ch.confirm_delivery()
        for i in range(300):
            ch.basic_publish(
                "",
                "busy",
                str(i).encode(),
                pika.BasicProperties(delivery_mode=2),
                mandatory=True,
            )  # BlockingChannel raises if a confirm is a nack or the message returns
        got = []
        for method, _props, body in ch.consume("busy", inactivity_timeout=10):
            if method is None:
                break
            got.append(int(body))
            ch.basic_ack(method.delivery_tag)
            if len(got) == 300:
                break
        ch.cancel()
        assert got == list(range(300))
    finally:
        conn.close()
    busy = busy_broker.server.listener.busy_wait
    assert busy.turns > 0  # reads armed it

    # Once traffic stops the loop sleeps again.
    for _ in range(300):
        if not busy_broker.call(lambda: busy.spinning):
            break
        time.sleep(0.1)
    assert not busy_broker.call(lambda: busy.spinning)
