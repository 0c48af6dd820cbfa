"""Fixtures of the cluster tests (see cluster_support)."""

from .cluster_support import cluster, cluster_dir  # noqa: F401
