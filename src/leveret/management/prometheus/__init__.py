"""Prometheus metrics in the names, types and labels of RabbitMQ's rabbitmq_prometheus.

Three endpoints, as RabbitMQ 3.10 has them (tests/compat/prometheus records its):

- `/metrics`: node totals; every per-object family summed into one unlabelled
  sample, so RabbitMQ's Grafana dashboards and alerts work unchanged;
- `/metrics/per-object`: the same families with a sample per queue, channel and
  connection (labels `vhost`/`queue`, `channel`);
- `/metrics/detailed?family=GROUP&vhost=V`: only the groups asked for (RabbitMQ's
  group names: `queue_coarse_metrics`, `channel_metrics`, ...), per object, named
  `rabbitmq_detailed_*`, plus the cluster-wide `rabbitmq_cluster_*` groups.

The families come from collectors (`collectors/`, one per package, as RabbitMQ's
rabbitmq_prometheus has a module per collector), which the launcher registers with
the node's `Metrics` in the order their families go out; each reads the live model
at scrape time, so metrics cost nothing between scrapes and nothing per message
beyond the counters broker/stats.py keeps anyway. Families that only an Erlang VM
has (reductions, schedulers, Mnesia, allocators) are left out:
docs/differences.md#prometheus lists them.

- `endpoint.py`: `Metrics` (the registered collectors, and one scrape of them) and
  `PrometheusServer` (the three endpoints);
- `scrape.py`: `Scrape`, what one scrape reads of the broker, shared by the collectors;
- `text.py`: `Family`, `Rendered` and the text format.

Leveret's own series start with `leveret_`: the store's fsync latency and group
commit sizes, and message bodies paged out to disk.
"""

from leveret.management.prometheus.collectors.core import max_tcp_sockets
from leveret.management.prometheus.endpoint import Collector, Metrics, PrometheusServer
from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, render, rendered

__all__ = [
    "Collector",
    "Family",
    "Metrics",
    "PrometheusServer",
    "Rendered",
    "Scrape",
    "max_tcp_sockets",
    "render",
    "rendered",
]
