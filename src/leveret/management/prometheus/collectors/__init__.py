"""The collectors: one per package whose figures Prometheus shows, registered by the
launcher (leveret/launcher.py) in the order their families go out.

- `core.py`: RabbitMQ's core groups (queues, channels, connections, the node), and
  the totals; `global_counters.py`: rabbit_global_counters; `alarms.py`: the
  resource alarms; `process.py`: the process start time; `identity.py`: identity
  and build info. These are RabbitMQ's families, from the model and the listener.
- `cluster.py` (a cluster leader), `links.py` (shovels, federation), `store.py` (a
  node with persistence), `delayed.py` (delayed exchanges): Leveret's own
  `leveret_*` families.

A collector's `collect(scrape)` yields `text.Rendered` families or
prometheus-client metrics for the scrape's endpoint (`scrape.mode`).
"""
