"""Deliberate differences in the translated suites, each with its docs/differences.md
entry; the management API's own allow-list applies here too."""

from __future__ import annotations

from ..common import Allowed

ALLOWED: list[Allowed] = []
