"""Latency bookkeeping and report formatting for `leveret perf`."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any


def percentile(sorted_values: Sequence[int], p: float) -> int | None:
    """Nearest-rank percentile of an already sorted sequence (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def ns_to_ms(value: int | None) -> float | None:
    return None if value is None else round(value / 1e6, 3)


class LatencySamples:
    """Latency samples (ns) over the measured window, in bounded memory.

    Keeping every sample of a long run at 100k msg/s would need gigabytes, so once
    `cap` is exceeded every other sample is dropped and the stride doubles: what remains
    is still a uniform systematic sample of all latencies. The max is tracked exactly.
    """

    def __init__(self, cap: int = 1_000_000) -> None:
        self.cap = cap
        self.samples = array("q")
        self.stride = 1
        self.seen = 0
        self.max = 0

    def add(self, values: list[int]) -> None:
        if not values:
            return
        self.max = max(self.max, max(values))
        if self.stride == 1:
            self.samples.extend(values)
        else:
            start = (-self.seen) % self.stride
            self.samples.extend(values[start :: self.stride])
        self.seen += len(values)
        while len(self.samples) > self.cap:
            self.samples = self.samples[::2]
            self.stride *= 2

    def summary(self) -> dict[str, float | int | None]:
        ordered = sorted(self.samples)
        return {
            "p50": ns_to_ms(percentile(ordered, 50)),
            "p95": ns_to_ms(percentile(ordered, 95)),
            "p99": ns_to_ms(percentile(ordered, 99)),
            "max": ns_to_ms(self.max) if self.seen else None,
            "samples": self.seen,
        }


LIVE_HEADER = (
    f"{'time':>7}  {'published/s':>12}  {'confirmed/s':>12}  {'consumed/s':>12}"
    f"  {'p50 ms':>8}  {'p99 ms':>8}"
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def live_line(
    elapsed: float,
    published: float,
    confirmed: float,
    consumed: float,
    p50: float | None,
    p99: float | None,
    warmup: bool,
) -> str:
    tail = "  (warm-up)" if warmup else ""
    return (
        f"{elapsed:>6.1f}s  {published:>12,.0f}  {confirmed:>12,.0f}  {consumed:>12,.0f}"
        f"  {_ms(p50):>8}  {_ms(p99):>8}{tail}"
    )


def human_summary(result: dict[str, Any]) -> str:
    """The end-of-run table printed when --json is not given."""
    lat = result["latency_ms"]
    lines = [
        "",
        f"leveret perf summary: {result['window_s']:.2f} s measured"
        f" (after {result['warmup_s']:g} s warm-up) against {result['broker']}",
        f"  {'':<12}{'msg/s':>14}{'total':>14}",
    ]
    for key in ("published", "confirmed", "nacked", "consumed"):
        lines.append(f"  {key:<12}{result[key + '_per_s']:>14,.0f}{result[key]:>14,}")
    if lat["samples"]:
        lines.append(
            f"  latency ms  p50 {_ms(lat['p50'])}  p95 {_ms(lat['p95'])}  p99 {_ms(lat['p99'])}"
            f"  max {_ms(lat['max'])}  ({lat['samples']:,} samples)"
        )
    else:
        lines.append("  latency ms  - (no messages consumed, or --size below 8 bytes)")
    for note in result["notes"]:
        lines.append(f"  note: {note}")
    if result["errors"]:
        lines.append(f"  errors ({len(result['errors'])}):")
        lines.extend(f"    - {err}" for err in result["errors"])
    else:
        lines.append("  errors      none")
    return "\n".join(lines)
