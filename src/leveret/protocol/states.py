"""The protocol core's vocabulary: roles, connection and channel states, default limits.

`connection.py` (the compiled parser), `handshake.py` and `lifecycle.py` all test and
set `Connection.state`; the names live here, apart from all three, so that the two
plain-Python modules need not import the compiled one (which imports them).
`leveret.protocol.connection` re-exports every name, and callers keep using it.
"""

from __future__ import annotations

CLIENT = "client"
SERVER = "server"

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
MAX_BODY_SIZE = 128 * 1024 * 1024  # RabbitMQ's default max_message_size

# Connection states. Client: NEW → AWAITING_START → AWAITING_TUNE → AWAITING_OPEN_OK → OPEN.
# Server: AWAITING_HEADER → AWAITING_START_OK → (caller accepts) → AWAITING_TUNE_OK
#         → AWAITING_OPEN → (caller accepts) → OPEN; or (caller refuses the login)
#         → LOGIN_REFUSED → CLOSED. Either: OPEN → CLOSING → CLOSED.
NEW = "new"
AWAITING_HEADER = "awaiting-header"
AWAITING_START = "awaiting-start"
AWAITING_START_OK = "awaiting-start-ok"
AUTHENTICATING = "authenticating"
LOGIN_REFUSED = "login-refused"  # server: the caller refused the login; input is ignored
AWAITING_TUNE = "awaiting-tune"
AWAITING_TUNE_OK = "awaiting-tune-ok"
AWAITING_OPEN = "awaiting-open"
OPENING = "opening"
AWAITING_OPEN_OK = "awaiting-open-ok"
OPEN = "open"
CLOSING = "closing"
CLOSED = "closed"

# Channel states (small ints: the compiled _Channel keeps its state as a C int).
CH_OPENING = 1
CH_OPEN = 2
CH_CLOSING = 3


class UsageError(Exception):
    """The local program asked for something the connection's state does not allow.

    For example publishing on a channel that is closed, or opening a channel
    before the handshake finished. Nothing was sent.
    """
