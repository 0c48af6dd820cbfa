"""The connector's AMQP side: leveret.client driven from Spark's synchronous code.

Why leveret.client (and not a client of our own): it speaks the protocol through the
same sans-IO core as the broker, takes several hosts in one URL, and recovers: after a
lost connection (a broker restart, a cluster failover) it reconnects to the next host
that answers, resumes a stream consumer after the last offset it handed out, and
publishes again whatever was not confirmed. A Spark task gets all of that for free.

Why a private event loop in the task's own thread (and not leveret.client.blocking's
loop thread): a task reads hundreds of thousands of deliveries a second, and handing
each one from a loop thread to the task thread would cost more than decoding it. The
loop runs only while the task waits for the broker (`TaskLoop.run`); between two
Arrow batches nothing runs, so heartbeats are off, as a stalled broker is noticed by
the silence timeout (`timeout`) instead.

Every error is an `AmqpError` whose text names the broker address and the failing step,
because it ends up in a Spark stack trace far from the code that caused it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from leveret.client import AuthenticationError, ConnectError, Connection, connect, parse_url
from leveret.client.url import ConnectionParameters, parse_urls

T = TypeVar("T")


class AmqpError(Exception):
    """Any failure talking to the broker; the text says where and what."""


class ConnectFailed(AmqpError):
    """The broker could not be reached (refused, timed out, name not found)."""


class LoginRefused(AmqpError):
    """The broker refused the user, the password or the vhost."""


class ConnectionLost(AmqpError):
    """The connection went and did not come back, or the broker fell silent."""


class PublishFailed(AmqpError):
    """A publisher confirm was a nack, or the message came back unroutable."""


def check_uri(uri: str) -> ConnectionParameters:
    """The URI's parameters; ValueError (leveret.client's InvalidURL) says what is wrong."""
    return parse_url(uri)


def where(params: ConnectionParameters) -> str:
    """The broker address(es) of a URI, for messages: `host:port[,host:port...]`."""
    return ",".join(f"{h}:{p}" for h, p in params.hosts)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class TaskLoop:
    """An event loop owned by one thread (a Spark task, or a driver call), run on demand."""

    def __init__(self) -> None:
        self.loop = _new_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        loop = self.loop
        if loop.is_closed():
            return
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    def __enter__(self) -> TaskLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def open_connection(
    uri: str, timeout: float, label: str, patience: float = 0.0, recovery: bool = True
) -> Connection:
    """Connect to the first host of `uri` that answers.

    `patience`: keep trying an unreachable broker (every host refused or silent) for
    that long, so a task started during a restart or a failover waits instead of
    failing; a refused login is never retried. With `recovery` the connection comes
    back by itself after a loss, giving up after about `timeout` seconds of failed
    attempts (the task fails then, and Spark retries it).
    """
    params = parse_urls(uri).with_options(
        connection_name=label, connect_timeout=timeout, heartbeat=0
    )
    address = where(params)
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return await connect(
                params,
                recovery=recovery,
                reconnect_delay=0.1,
                reconnect_max_delay=1.0,
                reconnect_attempts=max(3, int(timeout) + 2),
            )
        except AuthenticationError as exc:
            raise LoginRefused(str(exc)) from None
        except ConnectError as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectFailed(f"cannot reach the AMQP broker at {address}: {exc}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def close_quietly(conn: Connection | None) -> None:
    """Close politely; never raises (the task is over either way)."""
    if conn is None:
        return
    try:
        await conn.close(timeout=2.0)
    except Exception:  # noqa: BLE001 - a broken connection is closed all the same
        conn.abort()
