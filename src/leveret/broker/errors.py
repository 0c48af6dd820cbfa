"""Errors of the broker's administrative model (vhosts, users, permissions, limits).

They name what went wrong and carry no protocol codes: each front end maps
them to its own (server.amqp_errors to AMQP reply codes, the management API's
middleware to HTTP statuses, the ctl socket to error kinds). `str(error)` is
the reply text without the code's name, in RabbitMQ's words where it has some.
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


class PreconditionFailed(InvalidValue):
    """A declaration that differs from what exists, a bad argument, or an object in use."""


class UnknownType(InvalidValue):
    """An exchange type the broker does not have (AMQP treats it as a connection error)."""


class ResourceLocked(ModelError):
    """An exclusive queue that belongs to another connection."""


class NotSupported(ModelError):
    """An operation this kind of queue does not have, e.g. basic.get on a stream."""


class AccessRefused(ModelError):
    """A user may not do this (permissions, tags)."""


class LimitReached(ModelError):
    """A vhost limit (max-connections, max-queues) is reached."""
