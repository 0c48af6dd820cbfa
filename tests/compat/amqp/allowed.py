"""Deliberate differences of Leveret's AMQP answers from RabbitMQ 3.10.8.

Each entry names the scenario (fnmatch on its id), the kind and path of the
difference (as runner.compare reports them), its entry in docs/differences.md and a
reason a user would accept. An entry whose scenario pattern matches a scenario that
no longer shows the difference fails the replay test: remove it.
"""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = []
