"""Failed logins: how and when the broker ends them, and that nobody else waits.

RabbitMQ 3.10.8's reader sleeps 3 s before it closes a failed handshake. A client
that announced `authentication_failure_close` gets the 403 connection.close first,
at once, and the socket closes on its close-ok (or after the 3 s); one that did not
sees only the socket close, after the 3 s. Whether an answer came 2 s or more after
the start-ok is recorded (runner.RefusedLogin), not how long it took.
"""

from __future__ import annotations

from .runner import C, Session, scenario


def _work_meanwhile(s: Session) -> None:
    """Another client declares, publishes, gets and consumes while a login waits."""
    c = s.connect(label="other")
    c.open(1)
    c.rpc(1, C.Queue.Declare(queue="q"))
    c.confirm_select(1)
    c.publish(1, "", "q", b"m1")
    c.publish(1, "", "q", b"m2")
    c.confirms(1)
    c.get(1, "q")
    c.consume(1, "q", "t", no_ack=True)
    c.deliveries(1, 1)


@scenario
def refused_without_capability(s: Session) -> None:
    """No authentication_failure_close: the socket closes, later, with no close method."""
    login = s.refused_login(capable=False)
    _work_meanwhile(s)
    login.still_open()
    login.finish()


@scenario
def refused_with_capability(s: Session) -> None:
    """authentication_failure_close: the 403 connection.close; the client's close-ok
    ends the connection."""
    login = s.refused_login(capable=True)
    _work_meanwhile(s)
    login.finish()


@scenario
def refused_with_capability_no_close_ok(s: Session) -> None:
    """authentication_failure_close, and the client never answers the 403."""
    login = s.refused_login(capable=True, answer_close=False)
    login.finish()


@scenario
def refused_with_frames_behind_the_start_ok(s: Session) -> None:
    """tune-ok, connection.open, channel.open and connection.close in the same write
    as the refused start-ok change nothing: they are not acted on."""
    then = [
        (0, C.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)),
        (0, C.Connection.Open(virtual_host=s.vhost)),
        (1, C.Channel.Open()),
        (0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
    ]
    s.refused_login(capable=True, then=then).finish()
    s.refused_login(capable=False, then=then).finish()
