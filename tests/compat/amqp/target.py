"""An in-process Leveret to replay scenarios against (the CI test and replay.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .runner import BrokerAdmin, Target


@contextmanager
def leveret_target() -> Iterator[Target]:
    from leveret.config import ServerConfig
    from leveret.testing import EmbeddedBroker

    broker = EmbeddedBroker(ServerConfig(host="127.0.0.1", port=0, persistence=False)).start()
    try:
        yield Target("127.0.0.1", broker.port, BrokerAdmin(broker))
    finally:
        broker.stop()
