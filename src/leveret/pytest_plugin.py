"""pytest plugin (entry point `pytest11`): the `leveret_broker` fixture.

Install Leveret and write::

    def test_my_worker(leveret_broker):
        conn = pika.BlockingConnection(pika.URLParameters(leveret_broker))

Each test gets a fresh in-memory broker on an ephemeral loopback port, so tests
never see each other's queues. `leveret_embedded` gives the broker object itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leveret.testing import EmbeddedBroker, embedded_broker


@pytest.fixture
def leveret_embedded() -> Iterator[EmbeddedBroker]:
    with embedded_broker() as broker:
        yield broker


@pytest.fixture
def leveret_broker(leveret_embedded: EmbeddedBroker) -> str:
    """An AMQP URL (amqp://guest:guest@127.0.0.1:PORT/%2F) of a running broker."""
    return leveret_embedded.url
