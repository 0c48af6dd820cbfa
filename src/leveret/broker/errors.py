"""Errors of the broker's administrative model (vhosts, users, permissions, limits).

They name what went wrong and carry no protocol codes: each front end (AMQP,
the ctl socket, later the HTTP API) maps them to its own codes and status.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base class: `str(error)` is a sentence fit to show a person."""


class NotFound(ModelError):
    """The named vhost, user, permission or policy does not exist."""


class AlreadyExists(ModelError):
    """Creating something that is already there."""


class InvalidValue(ModelError):
    """A value the broker refuses: a bad regular expression, hash, limit or name."""


class AccessRefused(ModelError):
    """A user may not do this (permissions, tags)."""


class LimitReached(ModelError):
    """A vhost limit (max-connections, max-queues) is reached."""
