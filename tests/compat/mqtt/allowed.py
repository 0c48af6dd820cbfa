"""Where Leveret's MQTT answers differ from RabbitMQ 3.10's on purpose.

An entry names a scenario, the path of the observation that differs
(`observed.granted[]`, fnmatch patterns) and its entry in docs/differences.md;
the replay fails on any other difference, and on an entry that allows nothing.
"""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = []
