"""Partition tests: a Leveret cluster and its etcd on a private network of network
namespaces, nemeses under load, and a checker of what the clients saw.

`python -m tests.partitions --seed N --minutes M` runs a long schedule;
tests/partitions/test_partitions.py runs a short one (docs/cluster.md, "The
partition harness").
"""
