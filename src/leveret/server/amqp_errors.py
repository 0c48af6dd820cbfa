"""The model's errors (broker.errors) as AMQP reply codes.

The model names what went wrong; this table is the AMQP front end's reading of
it, as RabbitMQ answers the same cases. The management API reads the same
errors as HTTP statuses in its middleware.
"""

from __future__ import annotations

from leveret.broker.errors import (
    AccessRefused,
    AlreadyExists,
    InvalidValue,
    LimitReached,
    ModelError,
    NotFound,
    NotSupported,
    PreconditionFailed,
    ResourceLocked,
    UnknownType,
)
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    CONNECTION_EXCEPTIONS,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from leveret.protocol.errors import AMQPError, ChannelError, ConnectionError_

# Most specific first: UnknownType and PreconditionFailed are InvalidValues.
CODES: tuple[tuple[type[ModelError], int], ...] = (
    (NotFound, NOT_FOUND),
    (AccessRefused, ACCESS_REFUSED),
    (ResourceLocked, RESOURCE_LOCKED),
    (UnknownType, COMMAND_INVALID),  # a connection error, as in RabbitMQ
    (NotSupported, NOT_IMPLEMENTED),  # a connection error, as in RabbitMQ
    (PreconditionFailed, PRECONDITION_FAILED),
    (LimitReached, PRECONDITION_FAILED),
    (AlreadyExists, PRECONDITION_FAILED),
    (InvalidValue, PRECONDITION_FAILED),
)


def amqp_error(exc: ModelError) -> AMQPError:
    """The close method a model error becomes: channel.close, or connection.close for the
    codes AMQP calls hard errors."""
    code = next((c for kind, c in CODES if isinstance(exc, kind)), PRECONDITION_FAILED)
    error = ConnectionError_ if code in CONNECTION_EXCEPTIONS else ChannelError
    return error(code, str(exc))
