"""The translated suites: module name -> (scenarios, tests left out with the reason)."""

from __future__ import annotations

from . import rabbit_mgmt_http_SUITE, rabbit_mgmt_only_http_SUITE
from .scenario import Scenario

SUITES: dict[str, tuple[list[Scenario], dict[str, str]]] = {
    "rabbit_mgmt_http_SUITE": (
        rabbit_mgmt_http_SUITE.SCENARIOS,
        rabbit_mgmt_http_SUITE.NOT_TRANSLATED,
    ),
    "rabbit_mgmt_only_http_SUITE": (
        rabbit_mgmt_only_http_SUITE.SCENARIOS,
        rabbit_mgmt_only_http_SUITE.NOT_TRANSLATED,
    ),
}
