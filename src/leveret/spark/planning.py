"""Offset arithmetic done on the driver: resolve options into offsets, cut ranges into tasks.

Why pure functions: this is where exactly-once lives (which offsets a batch covers), so it
is kept free of I/O and tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from leveret.spark._tail import PartitionTail
from leveret.spark.options import EARLIEST, LATEST, Offsets, OptionError


class DataLoss(Exception):
    """Offsets that a query needs were deleted by retention (failOnDataLoss=true)."""


@dataclass(frozen=True)
class OffsetRange:
    """Exactly [start, end) of one stream; one Spark task reads one range."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def resolve(
    name: str,
    spec: Offsets,
    tails: Sequence[PartitionTail],
    default: int = EARLIEST,
) -> dict[str, int]:
    """Offsets per partition for `earliest`/`latest`/JSON; JSON must name real partitions."""
    if spec == "earliest":
        return {t.stream: t.first for t in tails}
    if spec == "latest":
        return {t.stream: t.next for t in tails}
    assert isinstance(spec, Mapping)
    known = {t.stream for t in tails}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise OptionError(
            f"option {name!r} names {unknown}, which are not partitions of this source "
            f"(the partitions are {[t.stream for t in tails]})"
        )
    out = {}
    for t in tails:
        value = spec.get(t.stream, default)
        out[t.stream] = t.first if value == EARLIEST else t.next if value == LATEST else value
    return out


def at_timestamp(tails: Sequence[PartitionTail]) -> dict[str, int]:
    """Per partition, the first offset stored at or after the asked timestamp."""
    return {
        t.stream: t.next if t.offset_for_timestamp is None else t.offset_for_timestamp
        for t in tails
    }


def check_start(
    start: Mapping[str, int], tails: Sequence[PartitionTail], fail_on_data_loss: bool
) -> dict[str, int]:
    """Move starts deleted by retention to the first stored offset, or raise DataLoss."""
    out = dict(start)
    for t in tails:
        s = out.get(t.stream)
        if s is None:
            continue
        if s < t.first:
            if fail_on_data_loss:
                raise DataLoss(
                    f"offsets {s}..{t.first - 1} of stream {t.stream!r} were deleted by "
                    "retention before they were read; set option 'failOnDataLoss' to false "
                    "to skip them"
                )
            out[t.stream] = t.first
    return out


def check_end(name: str, end: Mapping[str, int], tails: Sequence[PartitionTail]) -> None:
    for t in tails:
        if end[t.stream] > t.next:
            raise OptionError(
                f"option {name!r} asks for offset {end[t.stream]} of stream {t.stream!r}, "
                f"which holds offsets below {t.next} only"
            )


def ranges(
    start: Mapping[str, int], end: Mapping[str, int], order: Sequence[str]
) -> list[OffsetRange]:
    out = []
    for stream in order:
        s, e = start.get(stream), end.get(stream)
        if s is None or e is None:
            continue
        if s > e:
            raise OptionError(
                f"the start offset {s} of stream {stream!r} is after its end offset {e}"
            )
        if e > s:
            out.append(OffsetRange(stream, s, e))
    return out


def split(
    parts: Sequence[OffsetRange],
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """Cut ranges so each has at most `max_records` and there are at least `min_partitions`.

    Like Spark's Kafka source: a big range is cut into pieces of near-equal size, in
    proportion to its share of all the data, so that tasks finish together.
    """
    out: list[OffsetRange] = []
    total = sum(p.size for p in parts)
    for p in parts:
        pieces = 1
        if max_records:
            pieces = max(pieces, -(-p.size // max_records))
        if min_partitions and total and len(parts) < min_partitions:
            pieces = max(pieces, round(p.size * min_partitions / total))
        pieces = max(1, min(pieces, p.size))
        step, extra = divmod(p.size, pieces)
        s = p.start
        for i in range(pieces):
            e = s + step + (1 if i < extra else 0)
            out.append(OffsetRange(p.stream, s, e))
            s = e
    return out


def limit(
    start: Mapping[str, int], available: Mapping[str, int], max_messages: int
) -> dict[str, int]:
    """Admission control: end offsets covering at most `max_messages` in all, shared fairly.

    Each partition gets a share in proportion to what it has waiting, so a busy partition
    cannot starve the others (and every partition with data moves, as long as it fits).
    """
    waiting = {s: max(0, available[s] - start.get(s, available[s])) for s in available}
    total = sum(waiting.values())
    if total <= max_messages:
        return dict(available)
    end = {}
    budget = max_messages
    shares = {s: (w * max_messages) // total for s, w in waiting.items()}
    for s in available:
        end[s] = start.get(s, available[s]) + shares[s]
        budget -= shares[s]
    # hand the rounding remainder out one by one to partitions that still have data
    for s in sorted(waiting, key=lambda k: -waiting[k]):
        if budget <= 0:
            break
        if end[s] < available[s]:
            end[s] += 1
            budget -= 1
    return end
