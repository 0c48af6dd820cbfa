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
        workers = s.workers  # worker 0 of several: every worker's store
        paged_out, paged_out_bytes, in_memory = (
            state.paged_out, state.paged_out_bytes, state.memory_used
        )  # fmt: skip
        if workers is not None:
            paged_out = workers.counter(("store", "paged_out"), paged_out)
            paged_out_bytes = workers.counter(("store", "paged_out_bytes"), paged_out_bytes)
            in_memory = workers.gauge("bodies_in_memory", in_memory)
        if committer is not None:
            fsyncs, batches = committer.fsync_seconds, committer.batch_sizes
            if workers is not None:
                fsyncs = workers.histogram("fsync_seconds", fsyncs)
                batches = workers.histogram("batch_sizes", batches)
            yield histogram(
                "leveret_store_fsync_seconds",
                "Time one group-commit fsync of the message store took",
                fsyncs,
            )
            yield histogram(
                "leveret_store_group_commit_writes",
                "Writes made durable by one group commit (one write and fsync)",
                batches,
            )
        for family in (
            Family("leveret_paged_out_messages", "counter", "Message bodies moved out of RAM to disk")
            .add(paged_out),
            Family("leveret_paged_out_bytes", "counter", "Bytes of message bodies moved out of RAM to disk")
            .add(paged_out_bytes),
            Family("leveret_message_bodies_in_memory_bytes", "gauge", "Bytes of queued message bodies held in RAM")
            .add(in_memory),
        ):  # fmt: skip
            yield rendered(family)
