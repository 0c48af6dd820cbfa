"""leveret.management.prometheus.render writes what prometheus-client's generate_latest
writes for the same families, byte for byte."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, UnknownMetricFamily

from leveret.management.prometheus import Rendered, render


class _Registry:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return self.metrics


def _library(item: Rendered):
    kind = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}.get(
        item.kind, UnknownMetricFamily
    )
    names = list(item.samples[0][0]) if item.samples else []
    metric = kind(item.name, item.doc, labels=names)
    for labels, value in item.samples:
        metric.add_metric([labels[k] for k in names], value)
    return metric


def test_render_is_generate_latest():
    shared = {"vhost": "/", "queue": 'a "quoted"\\ back\nslash'}
    items = [
        Rendered("c", "counter", "a counter \\ with\nnewlines", [({}, 3)]),
        Rendered("g", "gauge", "per object", [(shared, 1.5), ({"vhost": "v", "queue": "q"}, 0)]),
        Rendered("g2", "gauge", "the same labels again", [(shared, 7)]),
        Rendered("u", "untyped", "info", [({"b": "2", "a": "1"}, 1)]),
        Rendered(
            "n", "gauge", "not a number", [({"x": "nan"}, math.nan), ({"x": "inf"}, math.inf)]
        ),
        Rendered(
            "big", "counter", "large and small", [({"k": "i"}, 12345678901234), ({"k": "f"}, 1e-7)]
        ),
        Rendered("empty", "counter", "no samples", []),
        Rendered("utf", "gauge", "non-ASCII", [({"queue": "chérie ✓"}, 2)]),
    ]
    assert render(items) == generate_latest(_Registry([_library(i) for i in items]))
