"""rabbitmq_identity_info and rabbitmq_build_info, on every endpoint."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import leveret
from leveret.management.prometheus.collectors.core import NODE
from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, rendered

#: the RabbitMQ version whose metrics these are (build_info's rabbitmq_version)
RABBITMQ_VERSION = "3.10.8"


def _info(s: Scrape) -> Iterator[Rendered]:
    cluster = s.broker.cluster_name
    yield rendered(
        Family("rabbitmq_identity_info", "untyped", "RabbitMQ node & cluster identity info").add(
            1,
            rabbitmq_node=NODE,
            rabbitmq_cluster=cluster,
            rabbitmq_cluster_permanent_id=s.broker.cluster_id,
        )
    )
    yield rendered(
        Family("rabbitmq_build_info", "untyped", "RabbitMQ & Erlang/OTP version info").add(
            1,
            rabbitmq_version=RABBITMQ_VERSION,
            prometheus_plugin_version=leveret.__version__,
            prometheus_client_version=CLIENT_VERSION,
            # No Erlang: the runtime that runs the broker, named as such.
            erlang_version=f"python-{platform.python_version()}",
        )
    )


def _distribution_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


CLIENT_VERSION = _distribution_version("prometheus-client")


class IdentityCollector:
    def collect(self, s: Scrape) -> Iterator[Rendered]:
        yield from _info(s)
