"""Deliberate differences of the management API from RabbitMQ 3.10.8, each with its
entry in docs/differences.md."""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = []
