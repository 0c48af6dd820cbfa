"""The Prometheus text format, and the families collectors hand to it.

A collector yields `Family`s (samples with every label) turned `Rendered` by
`rendered()` (with its prefix, and on `/metrics` summed by the labels it keeps), or
prometheus-client `Metric`s (histograms); `render()` writes them out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from leveret.store.committer import Buckets


@dataclass
class Family:
    """One family before rendering: samples carry every label; `kept` names the labels
    that stay when `/metrics` sums the per-object samples (e.g. `protocol`)."""

    name: str
    kind: str  # "gauge", "counter" (name without _total), "untyped"
    doc: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    kept: tuple[str, ...] = ()
    # Per-object samples as two columns (labels, values): no tuple per sample, which on a
    # scrape of thousands of queues is most of the work (and of the garbage).
    columns: tuple[list[dict[str, str]], list[float]] | None = None

    def add(self, value: float, **labels: str) -> Family:
        self.samples.append((labels, value))
        return self


class Rendered(NamedTuple):
    """A family as it goes out: full name, samples (aggregated on /metrics)."""

    name: str
    kind: str  # "counter" (name without _total), "gauge", "untyped"
    doc: str
    samples: Iterable[tuple[dict[str, str], float]]


def rendered(family: Family, prefix: str = "", per_object: bool = True) -> Rendered:
    samples: Iterable[tuple[dict[str, str], float]] = family.samples
    if family.columns is not None:
        labels, values = family.columns
        samples = (
            zip(labels, values, strict=True)
            if not family.samples
            else [
                *family.samples,
                *zip(labels, values, strict=True),
            ]
        )
    if not per_object:
        samples = list(samples)
    if not per_object and (family.kept or not samples or any(lb for lb, _v in samples)):
        # /metrics: sums by the kept labels (one unlabelled 0 when there is nothing)
        sums: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in samples:
            key = tuple((k, v) for k, v in labels.items() if k in family.kept)
            sums[key] = sums.get(key, 0) + value
        if not sums and not family.kept:
            sums[()] = 0
        samples = [(dict(k), v) for k, v in sums.items()]
    return Rendered(prefix + family.name, family.kind, family.doc, samples)


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(items: Iterable[Rendered | Metric]) -> bytes:
    """The Prometheus text format (0.0.4), as prometheus-client's generate_latest writes
    it (tests/unit/test_prometheus_text.py compares the two). Written here because a
    per-object scrape of 10,000 queues is 220,000 samples, and the library's per-sample
    objects made that take seconds on the broker's loop: here each object's label text
    is made once per scrape. Other metrics (histograms) go through the library."""
    items = list(items)  # alive until the end: label texts are cached by id()
    out: list[str] = []
    others: list[Metric] = []
    label_text: dict[int, str] = {}
    for item in items:
        if not isinstance(item, Rendered):
            others.append(item)
            continue
        name = item.name + "_total" if item.kind == "counter" else item.name
        doc = item.doc.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {item.kind}\n")
        for labels, value in item.samples:
            text = label_text.get(id(labels))
            if text is None:
                text = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
                text = label_text[id(labels)] = "{" + text + "}" if text else ""
            out.append(f"{name}{text} {floatToGoString(value)}\n")
    body = "".join(out).encode()
    if others:
        body += generate_latest(_Metrics(others))  # type: ignore[arg-type]
    return body


class _Metrics:
    """A registry-like list of prometheus-client metrics, for generate_latest."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    cumulative, running = [], 0
    for bound, count in zip((*buckets.bounds, float("inf")), buckets.counts, strict=True):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=buckets.sum)
