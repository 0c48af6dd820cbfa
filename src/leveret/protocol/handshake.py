"""The connection handshake of the protocol core, for both roles.

Everything between the first byte and connection.open-ok: the protocol header, then
start / start-ok / tune / tune-ok / open / open-ok, the credentials in start-ok and
the tuning rule. It runs once per connection, so it is plain Python apart from the
compiled parser in `connection.py`: these are functions of a `Connection`, and the
`Connection` methods (`initiate`, `accept_login`, `accept_open`) call them, and
so does the parser: the protocol header through `check_protocol_header`, each
handshake method through the channel-0 dispatch (`lifecycle.connection_method`,
which takes a connection.close out first).

Client role: `initiate` sends the header, `client_step` answers start and tune and
ends with `ConnectionOpened`. Server role: `check_protocol_header` answers the header
with connection.start, `server_step` turns start-ok and open into events for the
caller (`StartOkReceived`, `OpenRequested`), which answers with `accept_login` and
`accept_open`: authentication and the vhost are the broker's choice, not the core's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd
from pamqp import decode as pamqp_decode

from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    COMMAND_INVALID,
    CONNECTION_OPEN,
    CONNECTION_OPEN_OK,
    CONNECTION_START,
    CONNECTION_START_OK,
    CONNECTION_TUNE,
    CONNECTION_TUNE_OK,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
)
from leveret.protocol.errors import ConnectionError_
from leveret.protocol.events import (
    BadProtocolHeader,
    ConnectionOpened,
    OpenRequested,
    StartOkReceived,
)
from leveret.protocol.states import (
    AUTHENTICATING,
    AWAITING_OPEN,
    AWAITING_OPEN_OK,
    AWAITING_START,
    AWAITING_START_OK,
    AWAITING_TUNE,
    AWAITING_TUNE_OK,
    CLOSED,
    DEFAULT_FRAME_MAX,
    LOGIN_REFUSED,
    NEW,
    OPEN,
    OPENING,
    UsageError,
)

if TYPE_CHECKING:
    from leveret.protocol.connection import Connection


def parse_credentials(mechanism: str, response: bytes | str) -> tuple[str | None, str | None]:
    """(username, password) from a PLAIN or AMQPLAIN response; (None, None) if unreadable."""
    if isinstance(response, str):
        response = response.encode("utf-8", "surrogateescape")
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
        return None, None
    if mechanism == "AMQPLAIN":
        try:
            table = pamqp_decode.field_table(len(response).to_bytes(4, "big") + response)[1]
        except Exception:  # pamqp raises several types for a bad table
            return None, None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None:
            return None, None
        return str(login), str(password)
    return None, None


def negotiate(ours: int, theirs: int) -> int:
    """Tuning rule: the smaller of two limits, where 0 means 'no limit'."""
    if not ours:
        return theirs
    if not theirs:
        return ours
    return min(ours, theirs)


# --- client role ------------------------------------------------------------------


def initiate(conn: Connection) -> None:
    """Connection.initiate."""
    if not conn.client or conn.state != NEW:
        raise UsageError("initiate() is for a new client-role connection")
    conn._out.append(PROTOCOL_HEADER)
    conn.state = AWAITING_START


def client_step(conn: Connection, index: int, payload: bytes) -> None:
    """The server's next handshake method (not connection.close: the caller takes
    that): answer start with start-ok, tune with tune-ok and open; open-ok ends it."""
    method = wire.decode_method(payload)
    expected = {
        AWAITING_START: CONNECTION_START,
        AWAITING_TUNE: CONNECTION_TUNE,
        AWAITING_OPEN_OK: CONNECTION_OPEN_OK,
    }[conn.state]
    if index != expected:
        raise ConnectionError_(
            COMMAND_INVALID,
            f"expected {wire.method_name(expected)}, got {method.name} during the handshake",
            index >> 16,
            index & 0xFFFF,
        )
    if index == CONNECTION_START:
        conn.server_properties = dict(method.server_properties or {})
        offered = (method.mechanisms or "").split()
        mechanism = "PLAIN" if "PLAIN" in offered else "AMQPLAIN"
        if mechanism not in offered:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"the server offers no mechanism this client speaks ({method.mechanisms!r})",
            )
        if mechanism == "PLAIN":
            response: Any = f"\0{conn.username}\0{conn.password}"
        else:
            from pamqp import encode

            response = encode.field_table({"LOGIN": conn.username, "PASSWORD": conn.password})[
                4:
            ].decode("utf-8", "surrogateescape")
        conn._method(
            0,
            cmd.Connection.StartOk(
                client_properties=conn.client_properties,
                mechanism=mechanism,
                response=response,
                locale=conn.locale,
            ),
        )
        conn.state = AWAITING_TUNE
    elif index == CONNECTION_TUNE:
        conn.channel_max = negotiate(conn.channel_max, method.channel_max) or 65535
        conn.frame_max = negotiate(conn.frame_max, method.frame_max) or DEFAULT_FRAME_MAX
        if conn._wanted_heartbeat is None:
            conn.heartbeat = method.heartbeat
        else:
            conn.heartbeat = conn._wanted_heartbeat
        conn.reader.frame_max = conn.frame_max
        conn._method(
            0,
            cmd.Connection.TuneOk(
                channel_max=conn.channel_max, frame_max=conn.frame_max, heartbeat=conn.heartbeat
            ),
        )
        conn._method(0, cmd.Connection.Open(virtual_host=conn.vhost))
        conn.state = AWAITING_OPEN_OK
    else:
        conn.state = OPEN
        conn._events.append(
            ConnectionOpened(
                conn.server_properties, conn.channel_max, conn.frame_max, conn.heartbeat
            )
        )


# --- server role ------------------------------------------------------------------


def check_protocol_header(conn: Connection, data: bytes) -> bytes:
    """The first bytes a server receives: wait for all eight of the header, answer a
    good one with connection.start and return what follows it (b"" otherwise)."""
    buf = conn._header_buf + data
    if len(buf) < 8 and PROTOCOL_HEADER.startswith(buf):
        conn._header_buf = buf
        return b""
    conn._header_buf = b""
    if buf[:8] != PROTOCOL_HEADER:
        # Spec 4.2.2: answer with the version we speak, then close.
        conn._out.append(PROTOCOL_HEADER)
        conn.state = CLOSED
        conn._events.append(BadProtocolHeader(bytes(buf[:8])))
        return b""
    conn.state = AWAITING_START_OK
    conn._method(
        0,
        cmd.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=conn.server_properties,
            mechanisms=conn.mechanisms,
            locales=conn.locale,
        ),
    )
    return buf[8:]


def server_step(conn: Connection, index: int, payload: bytes) -> None:
    """The client's next handshake method (not connection.close: the caller takes
    that): start-ok and open become events for the caller; tune-ok is checked
    against what we offered and applied."""
    method = wire.decode_method(payload)
    expected = {
        AWAITING_START_OK: CONNECTION_START_OK,
        AWAITING_TUNE_OK: CONNECTION_TUNE_OK,
        AWAITING_OPEN: CONNECTION_OPEN,
    }.get(conn.state)
    if expected is None or index != expected:
        wanted = wire.method_name(expected) if expected else "nothing"
        raise ConnectionError_(
            COMMAND_INVALID,
            f"expected {wanted}, got {method.name} during the handshake",
            index >> 16,
            index & 0xFFFF,
        )
    if index == CONNECTION_START_OK:
        props = dict(method.client_properties or {})
        conn.client_properties = props
        username, password = parse_credentials(method.mechanism, method.response)
        conn.state = AUTHENTICATING
        conn._events.append(
            StartOkReceived(method.mechanism, username, password, props, method.locale)
        )
    elif index == CONNECTION_TUNE_OK:
        channel_max = method.channel_max or conn.channel_max
        frame_max = method.frame_max or conn.frame_max
        for what, value, limit in (
            ("channel_max", channel_max, conn.channel_max),
            ("frame_max", frame_max, conn.frame_max),
        ):
            if value > limit:
                raise ConnectionError_(
                    NOT_ALLOWED,
                    f"negotiated {what} = {value} is higher than the maximum allowed "
                    f"value ({limit})",
                    10,
                    31,
                )
        if frame_max < FRAME_MIN_SIZE:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is lower than the minimum allowed "
                f"value ({FRAME_MIN_SIZE})",
                10,
                31,
            )
        conn.channel_max = channel_max
        conn.frame_max = frame_max
        conn.reader.frame_max = frame_max
        conn.heartbeat = method.heartbeat
        conn.state = AWAITING_OPEN
    else:
        conn.state = OPENING
        conn._events.append(OpenRequested(method.virtual_host))


def accept_login(conn: Connection) -> None:
    """Connection.accept_login."""
    if conn.state != AUTHENTICATING:
        raise UsageError(f"accept_login() in state {conn.state}")
    conn.state = AWAITING_TUNE_OK
    conn._method(
        0,
        cmd.Connection.Tune(
            channel_max=conn.channel_max, frame_max=conn.frame_max, heartbeat=conn.heartbeat
        ),
    )


def refuse_login(conn: Connection) -> None:
    """Connection.refuse_login."""
    if conn.state != AUTHENTICATING:
        raise UsageError(f"refuse_login() in state {conn.state}")
    conn.state = LOGIN_REFUSED


def accept_open(conn: Connection) -> None:
    """Connection.accept_open."""
    if conn.state != OPENING:
        raise UsageError(f"accept_open() in state {conn.state}")
    conn.state = OPEN
    conn._method(0, cmd.Connection.OpenOk())
