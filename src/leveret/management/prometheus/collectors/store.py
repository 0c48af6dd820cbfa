"""leveret_store_* and the paging counters: the message store's group commits and
fsyncs, and bodies moved out of RAM (a node with persistence only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, histogram, rendered

if TYPE_CHECKING:
    from leveret.persistence.durable_state import DurableState


class StoreCollector:
    def __init__(self, state: DurableState) -> None:
        self.state = state

    def collect(self, s: Scrape) -> Iterator[Rendered | Metric]:
        if s.mode == "detailed":
            return
        state = self.state
        committer = state.messages.committer
        if committer is not None:
            yield histogram(
                "leveret_store_fsync_seconds",
                "Time one group-commit fsync of the message store took",
                committer.fsync_seconds,
            )
            yield histogram(
                "leveret_store_group_commit_writes",
                "Writes made durable by one group commit (one write and fsync)",
                committer.batch_sizes,
            )
        for family in (
            Family("leveret_paged_out_messages", "counter", "Message bodies moved out of RAM to disk")
            .add(state.paged_out),
            Family("leveret_paged_out_bytes", "counter", "Bytes of message bodies moved out of RAM to disk")
            .add(state.paged_out_bytes),
            Family("leveret_message_bodies_in_memory_bytes", "gauge", "Bytes of queued message bodies held in RAM")
            .add(state.memory_used),
        ):  # fmt: skip
            yield rendered(family)
