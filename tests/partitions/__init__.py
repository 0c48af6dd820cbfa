"""Partition tests: a Leveret cluster and its etcd on a private network of network
namespaces, nemeses under load, and a checker of what the clients saw.

`python -m tests.partitions --seed N --minutes M [--workers 2]` runs a long schedule;
tests/partitions/test_partitions.py runs short ones, test_partitions_workers.py on
nodes of two workers (docs/cluster.md, "The partition harness").
"""
