"""The AMQP scenario runner: one scenario, written once, run against either broker.

A scenario is a function `(s: Session) -> None` registered with `@scenario` in a
`scenarios_*.py` module of this package (one module per topic, so several engineers
add scenarios without touching the same file).  It speaks raw AMQP frames through
`tests/rawamqp.py` (Leveret's own protocol codec under a plain socket), and every call
it makes records what the broker answered: the reply method and its fields, or the
`channel.close` / `connection.close` that came instead (code, text, class and
method); messages with their routing fields, properties, headers (`x-death`,
`x-delivery-count`, `x-stream-offset`, ...) and bodies; which publishes were
confirmed or nacked; the frames on a channel in the order they came.

Each scenario runs in a vhost of its own (`cx-<scenario id>`), so the names it uses
are its own on both brokers and the reply texts that name a vhost are the same.
What changes from run to run is masked as it is recorded: server-generated names
(`amq.gen-*`, `amq.ctag-*`, direct reply-to tokens) become `{gen1}`, `{ctag1}`, ...
in order of appearance, and timestamps (`x-death[].time`) become "$volatile".

    record.py   runs every scenario against RabbitMQ 3.10.8, writes recordings/
    test_amqp_replay.py   runs each against an in-process Leveret and compares
    replay.py   prints every difference (allowed ones too)
"""

from __future__ import annotations

import base64
import datetime
import decimal
import fnmatch
import importlib
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from pamqp import commands

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE / "recordings"
TESTS = HERE.parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from rawamqp import (  # noqa: E402
    ConnectionLost,
    RawClient,
    Timeout,
    content_frames,
    method_frame,
    plain_response,
)

from ..common import VOLATILE, Difference, read_json, write_json  # noqa: E402

P = commands.Basic.Properties
C = commands  # scenarios write C.Queue.Declare(...)

#: how long a scenario waits for an answer it expects
WAIT = 5.0
#: how long "nothing else arrives" is watched (replaying; recording: SETTLE_RECORD)
SETTLE = 0.3
SETTLE_RECORD = 1.0

# --- registry --------------------------------------------------------------------------


@dataclass
class Scenario:
    id: str  # "<module suffix>.<function name>"
    func: Callable[[Session], None]
    doc: str

    @property
    def recording(self) -> Path:
        topic, _, name = self.id.partition(".")
        return RECORDINGS / topic / f"{name}.json"

    @property
    def vhost(self) -> str:
        return "cx-" + self.id


_REGISTERED: list[Callable[[Session], None]] = []


def scenario(func: Callable[[Session], None]) -> Callable[[Session], None]:
    """Register a scenario (the module's suffix and the function's name make its id)."""
    _REGISTERED.append(func)
    return func


def discover() -> dict[str, Scenario]:
    """Every scenario of every `scenarios_*.py` module here, by id."""
    for path in sorted(HERE.glob("scenarios_*.py")):
        importlib.import_module(f"{__package__}.{path.stem}")
    out: dict[str, Scenario] = {}
    for func in _REGISTERED:
        topic = func.__module__.rpartition(".")[2].removeprefix("scenarios_")
        sid = f"{topic}.{func.__name__}"
        out[sid] = Scenario(sid, func, (func.__doc__ or "").strip())
    return dict(sorted(out.items()))


# --- the brokers' admin side -------------------------------------------------------------


class Admin:
    """Vhosts, users, permissions and policies: what a scenario sets up around AMQP."""

    def add_vhost(self, name: str) -> None: ...
    def delete_vhost(self, name: str) -> None: ...
    def add_user(self, name: str, password: str) -> None: ...
    def delete_user(self, name: str) -> None: ...
    def set_permissions(self, user: str, vhost: str, conf: str, write: str, read: str) -> None: ...
    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, **kw) -> None: ...


class HttpAdmin(Admin):
    """RabbitMQ's management API."""

    def __init__(self, base: str, user: str = "guest", password: str = "guest") -> None:
        self.base = base.rstrip("/")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def _call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            if not (missing_ok and exc.code == 404):
                raise

    def add_vhost(self, name: str) -> None:
        self._call("PUT", f"/api/vhosts/{quote(name, safe='')}", {})

    def delete_vhost(self, name: str) -> None:
        self._call("DELETE", f"/api/vhosts/{quote(name, safe='')}", missing_ok=True)

    def add_user(self, name: str, password: str) -> None:
        self._call("PUT", f"/api/users/{quote(name, safe='')}", {"password": password, "tags": ""})

    def delete_user(self, name: str) -> None:
        self._call("DELETE", f"/api/users/{quote(name, safe='')}", missing_ok=True)

    def set_permissions(self, user: str, vhost: str, conf: str, write: str, read: str) -> None:
        body = {"configure": conf, "write": write, "read": read}
        self._call("PUT", f"/api/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}", body)

    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, **kw) -> None:
        body = {
            "pattern": pattern,
            "definition": definition,
            "priority": kw.get("priority", 0),
            "apply-to": kw.get("apply_to", "all"),
        }
        self._call("PUT", f"/api/policies/{quote(vhost, safe='')}/{quote(name, safe='')}", body)


class BrokerAdmin(Admin):
    """An in-process Leveret's admin operations (leveret.testing.EmbeddedBroker.admin)."""

    def __init__(self, broker: Any) -> None:
        self.admin = broker.admin

    def add_vhost(self, name: str) -> None:
        self.admin.add_vhost(name)

    def delete_vhost(self, name: str) -> None:
        try:
            self.admin.delete_vhost(name)
        except Exception as exc:  # absent already
            if "does not exist" not in str(exc):
                raise

    def add_user(self, name: str, password: str) -> None:
        self.admin.add_user(name, password, replace=True)

    def delete_user(self, name: str) -> None:
        try:
            self.admin.delete_user(name)
        except Exception as exc:
            if "does not exist" not in str(exc):
                raise

    def set_permissions(self, user: str, vhost: str, conf: str, write: str, read: str) -> None:
        self.admin.set_permissions(user, vhost, conf, write, read)

    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, **kw) -> None:
        self.admin.set_policy(
            vhost, name, pattern, definition, kw.get("priority", 0), kw.get("apply_to", "all")
        )


@dataclass
class Target:
    """A broker to run scenarios against: where AMQP is, and its admin side."""

    host: str
    port: int
    admin: Admin
    user: str = "guest"
    password: str = "guest"
    #: the management API's base URL, for scenarios that declare through it (`s.http`)
    management: str | None = None

    @classmethod
    def rabbitmq(cls, amqp_url: str, management_url: str) -> Target:
        u = urlparse(amqp_url)
        return cls(
            u.hostname or "127.0.0.1",
            u.port or 5672,
            HttpAdmin(
                management_url, unquote(u.username or "guest"), unquote(u.password or "guest")
            ),
            unquote(u.username or "guest"),
            unquote(u.password or "guest"),
            management_url,
        )


# --- masking -----------------------------------------------------------------------------

_GENERATED = re.compile(
    r"amq\.gen-[A-Za-z0-9_\-]+|amq\.ctag-[A-Za-z0-9_\-]+"
    r"|amq\.rabbitmq\.reply-to\.[A-Za-z0-9_.=+/\-]+"
)
_KINDS = {"amq.gen-": "gen", "amq.ctag-": "ctag", "amq.rabbitmq.reply-to.": "reply"}


class Placeholders:
    """Server-generated names, numbered in order of appearance per kind."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.volatile: set[str] = set()  # method fields masked in this scenario

    def sub(self, text: str) -> str:
        return _GENERATED.sub(self._one, text)

    def _one(self, match: re.Match) -> str:
        value = match.group(0)
        if value not in self.seen:
            kind = next(k for p, k in _KINDS.items() if value.startswith(p))
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.seen[value] = "{" + f"{kind}{self.counts[kind]}" + "}"
        return self.seen[value]


#: header fields whose values change from run to run (x-death's time)
VOLATILE_KEYS = {"time"}


def plain(value: Any, names: Placeholders, key: str = "", typed: bool = False) -> Any:
    """A decoded AMQP value as JSON, with generated names and timestamps masked;
    `typed`: numbers keep their wire type ("byte:5")."""
    if key in VOLATILE_KEYS:
        return VOLATILE
    if isinstance(value, dict):
        return {k: plain(v, names, k, typed) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [plain(v, names, "", typed) for v in value]
    if isinstance(value, bytes):
        try:
            return names.sub(value.decode())
        except UnicodeDecodeError:
            return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, str):
        return names.sub(value)
    if isinstance(value, datetime.datetime):
        return {"$timestamp": int(value.timestamp())}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        kind = getattr(value, "amqp_type", None)
        plain_number = float(value) if isinstance(value, float) else int(value)
        # In headers the wire type is part of what a client sees (x-death's count is
        # a long on RabbitMQ): recorded as "long:1".
        return f"{kind}:{plain_number}" if kind and typed else plain_number
    return value


def method_name(method: Any) -> str:
    """pamqp's "Queue.DeclareOk" as the spec writes it: "queue.declare-ok"."""
    cls, _, meth = method.name.partition(".")
    return cls.lower() + "." + re.sub(r"(?<!^)([A-Z])", r"-\1", meth).lower()


def method_fields(method: Any, names: Placeholders) -> dict[str, Any]:
    out: dict[str, Any] = {"method": method_name(method)}
    for key, value in method:
        if key in ("ticket", "nowait"):
            continue
        out[key] = VOLATILE if key in names.volatile else plain(value, names, key)
    return out


def ranges(numbers: list[int]) -> list[list[int]]:
    """[1, 2, 3, 5] → [[1, 3], [5, 5]]."""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


# --- a connection ------------------------------------------------------------------------


@dataclass
class Event:
    """A method, or a content method with its properties and body."""

    channel: int
    method: Any
    properties: Any = None
    body: bytes = b""

    @property
    def name(self) -> str:
        return method_name(self.method)


_CONTENT = (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)
_ASYNC = (
    commands.Basic.Deliver,
    commands.Basic.Return,
    commands.Basic.Ack,
    commands.Basic.Nack,
    commands.Basic.Cancel,
    commands.Channel.Flow,
)


class ClosedError(Exception):
    pass


@dataclass
class Conn:
    """One AMQP connection of a scenario; every call records a step."""

    session: Session
    label: str
    raw: RawClient
    closed: bool = False
    pending: dict[int, deque[Event]] = field(default_factory=dict)
    confirm_seq: dict[int, int] = field(default_factory=dict)
    settled: dict[int, dict[int, str]] = field(default_factory=dict)
    close_event: Event | None = None  # the broker's connection.close, once it came
    close_reported: bool = False

    # -- recording --

    def _step(self, op: str, ch: int | None, **what: Any) -> dict[str, Any]:
        step: dict[str, Any] = {"conn": self.label, "op": op}
        if ch is not None:
            step["ch"] = ch
        step.update(what)
        self.session.steps.append(step)
        return step

    def _message(self, ev: Event) -> dict[str, Any]:
        names = self.session.names
        out = method_fields(ev.method, names)
        props = {}
        if ev.properties is not None:
            for key, value in ev.properties:
                if value is not None:
                    props[key] = plain(value, names, key, typed=key == "headers")
        out["properties"] = props
        out["body"] = plain(ev.body, names)
        return out

    def _reply(self, ev: Event | None) -> dict[str, Any]:
        if ev is None:
            return {"method": "(nothing)"}
        if isinstance(ev.method, _CONTENT):
            return self._message(ev)
        return method_fields(ev.method, self.session.names)

    # -- frames in --

    def _read_event(self, deadline: float) -> Event:
        if self.closed:
            raise ClosedError
        ch, frame = self.raw.read_frame(timeout=max(0.001, deadline - time.monotonic()))
        if isinstance(frame, _CONTENT):
            _c, head = self.raw.read_frame(timeout=max(0.001, deadline - time.monotonic()))
            body = b""
            while len(body) < head.body_size:
                _c, part = self.raw.read_frame(timeout=max(0.001, deadline - time.monotonic()))
                body += part.value
            return Event(ch, frame, head.properties, body)
        return Event(ch, frame)

    def _take(self, ev: Event) -> Event | None:
        """Handle what every client handles by itself; None if nothing is left to do."""
        if isinstance(ev.method, commands.Connection.Close):
            self._send(0, commands.Connection.CloseOk())
            self.closed = True
            self.close_event = ev
            return ev
        if isinstance(ev.method, commands.Channel.Close):
            self._send(ev.channel, commands.Channel.CloseOk())
            return ev
        return ev

    def _send(self, ch: int, method: Any) -> None:
        try:
            self.raw.send_method(ch, method)
        except OSError:
            self.closed = True

    def wait(self, ch: int, *types: type, timeout: float = WAIT) -> Event | None:
        """The next event on `ch` of one of `types`, or the close that came instead;
        async events meanwhile are kept (for deliveries(), confirms(), events()).
        None if nothing came in time."""
        deadline = time.monotonic() + timeout
        queue = self.pending.setdefault(ch, deque())
        for ev in list(queue):
            if isinstance(ev.method, types):
                queue.remove(ev)
                return ev
        while True:
            try:
                ev = self._take(self._read_event(deadline))
            except (Timeout, ConnectionLost, ClosedError):
                if not self.closed and self.raw.closed:
                    self.closed = True
                return None
            if isinstance(ev.method, commands.Connection.Close):
                self.close_reported = True  # the caller records it as the answer
                return ev
            if ev.channel == ch and isinstance(ev.method, commands.Channel.Close):
                return ev
            if ev.channel == ch and isinstance(ev.method, types):
                return ev
            if isinstance(ev.method, commands.Channel.Close):
                self.pending.setdefault(ev.channel, deque()).append(ev)
                continue
            self.pending.setdefault(ev.channel, deque()).append(ev)

    # -- calls --

    def open(self, ch: int = 1) -> dict:
        return self.rpc(ch, commands.Channel.Open())

    def rpc(self, ch: int, method: Any, timeout: float = WAIT) -> dict:
        """Send a synchronous method; record its reply (or the close that came)."""
        self._send(ch, method)
        reply_types = tuple(_reply_types(method))
        ev = self.wait(ch, *reply_types, timeout=timeout)
        return self._step(method_name(method), ch, reply=self._reply(ev))["reply"]

    @contextmanager
    def one_write(self) -> Iterator[None]:
        """Everything the block sends (publishes, raw methods) leaves in one socket
        write at its end, so the broker reads it together: a burst of publishes and
        the channel.close behind it, as a client that pipelines them sends them."""
        parts: list[bytes] = []
        self.raw.send = parts.append  # type: ignore[method-assign]  # (send_method too)
        try:
            yield
        finally:
            del self.raw.send
            try:
                self.raw.send(b"".join(parts))
            except OSError:
                self.closed = True

    def send(self, ch: int, method: Any) -> None:
        """Send a method that has no reply (basic.ack, basic.reject, ...)."""
        self._send(ch, method)
        self._step(method_name(method), ch)

    def publish(
        self,
        ch: int,
        exchange: str,
        routing_key: str,
        body: bytes | str = b"",
        props: commands.Basic.Properties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
        **prop_fields: Any,
    ) -> None:
        if isinstance(body, str):
            body = body.encode()
        if props is None:
            props = commands.Basic.Properties(**prop_fields)
        frames = method_frame(
            ch,
            commands.Basic.Publish(
                exchange=exchange,
                routing_key=routing_key,
                mandatory=mandatory,
                immediate=immediate,
            ),
        ) + content_frames(ch, body, props)
        try:
            self.raw.send(frames)
        except OSError:
            self.closed = True
        if ch in self.confirm_seq:
            self.confirm_seq[ch] += 1

    def confirm_select(self, ch: int) -> dict:
        reply = self.rpc(ch, commands.Confirm.Select())
        self.confirm_seq[ch] = 0
        self.settled[ch] = {}
        return reply

    def get(self, ch: int, queue: str, no_ack: bool = True, wait: float = 0.0) -> dict:
        """basic.get; with `wait`, a get-empty is asked again for up to `wait` seconds
        (RabbitMQ dead-letters asynchronously), and only the last answer is recorded."""
        deadline = time.monotonic() + wait
        while True:
            method = commands.Basic.Get(queue=queue, no_ack=no_ack)
            self._send(ch, method)
            ev = self.wait(ch, commands.Basic.GetOk, commands.Basic.GetEmpty)
            if (
                ev is not None
                and isinstance(ev.method, commands.Basic.GetEmpty)
                and time.monotonic() < deadline
            ):
                time.sleep(0.02)
                continue
            return self._step("basic.get", ch, reply=self._reply(ev))["reply"]

    def consume(
        self,
        ch: int,
        queue: str,
        tag: str = "",
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: dict | None = None,
    ) -> dict:
        return self.rpc(
            ch,
            commands.Basic.Consume(
                queue=queue,
                consumer_tag=tag,
                no_ack=no_ack,
                exclusive=exclusive,
                arguments=arguments or {},
            ),
        )

    def deliveries(self, ch: int, n: int, timeout: float = WAIT) -> list[dict]:
        """Record the next `n` deliveries on `ch` (fewer if they stop coming, or
        the channel's close if that came instead)."""
        got: list[dict] = []
        while len(got) < n:
            ev = self.wait(ch, commands.Basic.Deliver, timeout=timeout)
            if ev is None:
                break
            if not isinstance(ev.method, commands.Basic.Deliver):
                got.append(self._reply(ev))
                break
            got.append(self._message(ev))
        self._step("deliveries", ch, expected=n, got=got)
        return got

    def confirms(self, ch: int, timeout: float = WAIT) -> dict:
        """Wait until every publish so far on `ch` is acked or nacked; record which."""
        upto = self.confirm_seq.get(ch, 0)
        settled = self.settled.setdefault(ch, {})
        deadline = time.monotonic() + timeout
        closed = None
        while len([s for s in settled if s <= upto]) < upto:
            ev = self.wait(
                ch,
                commands.Basic.Ack,
                commands.Basic.Nack,
                timeout=max(0.001, deadline - time.monotonic()),
            )
            if ev is None:
                break
            if not isinstance(ev.method, commands.Basic.Ack | commands.Basic.Nack):
                closed = self._reply(ev)
                break
            kind = "ack" if isinstance(ev.method, commands.Basic.Ack) else "nack"
            tag = ev.method.delivery_tag
            for seq in range(1, tag + 1) if ev.method.multiple else (tag,):
                settled.setdefault(seq, kind)
        result: dict[str, Any] = {
            "acked": ranges([s for s, k in settled.items() if k == "ack" and s <= upto]),
            "nacked": ranges([s for s, k in settled.items() if k == "nack" and s <= upto]),
        }
        if closed is not None:
            result["close"] = closed
        self._step("confirms", ch, published=upto, **result)
        return result

    def events(self, ch: int, settle: float | None = None) -> list[dict]:
        """Record every async event on `ch` (deliveries, returns, cancels, acks, or
        the connection's close) kept or arriving within `settle` seconds.

        Replaying, the recording says how many came from RabbitMQ: those are waited
        for (up to WAIT, so a loaded machine does not lose them), then `settle` more
        seconds for any extra. Recording, the settle time is longer (SETTLE_RECORD)."""
        expected = self.session.expected_step(len(self.session.steps))
        want = len(expected.get("got", ())) if expected and expected["op"] == "events" else 0
        if settle is None:
            settle = SETTLE if self.session.expected is not None else SETTLE_RECORD
        queue = self.pending.setdefault(ch, deque())
        wait_until = time.monotonic() + WAIT
        deadline = time.monotonic() + settle
        while True:
            have = len(queue) + (self.close_event is not None and not self.close_reported)
            if have < want:
                deadline = max(deadline, min(wait_until, time.monotonic() + settle))
            try:
                ev = self._take(self._read_event(deadline if have >= want else wait_until))
            except (Timeout, ConnectionLost, ClosedError):
                break
            if ev is not self.close_event:  # (reported once, below)
                self.pending.setdefault(ev.channel, deque()).append(ev)
        got = [self._reply(ev) for ev in self.pending.pop(ch, deque())]
        if self.close_event is not None and not self.close_reported:
            self.close_reported = True  # the connection ended meanwhile: say how
            got.append(self._reply(self.close_event))
        self._step("events", ch, got=got)
        return got

    def frames(self, until: Callable[[Event], bool], settle: float = SETTLE) -> list[Event]:
        """Events in arrival order (nothing recorded: the scenario records what it
        derives), up to the one `until` accepts, then those of `settle` seconds."""
        out: list[Event] = []
        deadline = time.monotonic() + WAIT
        while True:
            try:
                ev = self._take(self._read_event(deadline))
            except (Timeout, ConnectionLost, ClosedError):
                return out
            out.append(ev)
            if until(ev):
                break
        deadline = time.monotonic() + settle
        while True:
            try:
                out.append(self._take(self._read_event(deadline)))
            except (Timeout, ConnectionLost, ClosedError):
                return out

    def ack(self, ch: int, tag: int, multiple: bool = False) -> None:
        self.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    def nack(self, ch: int, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.send(ch, commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue))

    def reject(self, ch: int, tag: int, requeue: bool = True) -> None:
        self.send(ch, commands.Basic.Reject(delivery_tag=tag, requeue=requeue))

    def close_channel(self, ch: int) -> dict:
        return self.rpc(
            ch, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )

    def close(self, record: bool = True) -> None:
        """Close politely if still open (a step only when it was open and `record`)."""
        if self.closed:
            return
        self._send(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        ev = self.wait(0, commands.Connection.CloseOk)
        self.closed = True
        if record:
            self._step("connection.close", 0, reply=self._reply(ev))
        self.raw.sock.close()

    def alive(self) -> bool:
        """Whether the connection still answers (records the answer)."""
        ev = None
        if not self.closed:
            ch = 999
            self._send(ch, commands.Channel.Open())
            ev = self.wait(ch, commands.Channel.OpenOk, timeout=WAIT)
            if ev is not None and isinstance(ev.method, commands.Channel.OpenOk):
                self._send(
                    ch,
                    commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
                )
                self.wait(ch, commands.Channel.CloseOk)
        ok = ev is not None and isinstance(ev.method, commands.Channel.OpenOk)
        if ok:
            self._step("alive", None, alive=True)
        else:  # what ended it, if anything came
            if ev is None and self.close_event is not None and not self.close_reported:
                ev = self.close_event
            self.close_reported = True
            self._step("alive", None, alive=False, reply=self._reply(ev))
        return ok


def _reply_types(method: Any) -> Iterator[type]:
    """The methods that answer `method` (pamqp names them `<Name>Ok`, plus get-empty)."""
    cls = type(method)
    outer = getattr(commands, cls.__qualname__.split(".")[0])
    ok = getattr(outer, cls.__name__ + "Ok", None)
    if ok is not None:
        yield ok
    if cls is commands.Basic.Get:
        yield commands.Basic.GetEmpty
    if cls is commands.Channel.Close:
        yield commands.Channel.CloseOk


# --- a refused login, answered later --------------------------------------------------------

#: a broker's wait before it ends a failed login is recorded as "at least this long"
#: or not: a lower bound only, so a slow machine cannot change what is recorded
SLOW_ANSWER = 2.0


class RefusedLogin:
    """A login with a wrong password whose answer a scenario takes later
    (Session.refused_login), so that it can use other connections meanwhile.

    `finish()` records what ended it (a connection.close, or the socket closing
    with no close method) and, for each, whether it came SLOW_ANSWER seconds or
    more after the start-ok: a broker that makes failed logins wait, and whether
    it made this one wait, without recording how fast either broker is."""

    def __init__(
        self,
        session: Session,
        label: str,
        capable: bool,
        answer_close: bool,
        then: list[tuple[int, Any]],
    ) -> None:
        self.session = session
        self.label = label
        self.answer_close = answer_close
        self.raw = RawClient(session.target.host, session.target.port, timeout=WAIT)
        caps = {"publisher_confirms": True, "basic.nack": True}
        if capable:
            caps["authentication_failure_close"] = True
        self.raw.send_protocol_header()
        self.raw.wait_for(commands.Connection.Start)
        start_ok = commands.Connection.StartOk(
            client_properties={"capabilities": caps},
            mechanism="PLAIN",
            response=plain_response(session.target.user, "not-the-password"),
        )
        data = method_frame(0, start_ok) + b"".join(method_frame(ch, m) for ch, m in then)
        self.raw.send(data)
        self.sent = time.monotonic()

    def still_open(self) -> bool:
        """Whether the broker has not ended it yet (recorded; nothing is waited for)."""
        sock = self.raw.sock
        sock.setblocking(False)
        try:
            is_open = sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            is_open = True
        except OSError:
            is_open = False
        finally:
            sock.settimeout(WAIT)
        self.session.steps.append({"conn": self.label, "op": "login.pending", "open": is_open})
        return is_open

    def finish(self, limit: float = 15.0) -> list[dict]:
        """Read until the broker closes the socket (up to `limit` seconds); record
        every frame and the close, each with whether it came slowly."""
        got: list[dict] = []
        deadline = time.monotonic() + limit
        while True:
            try:
                _ch, frame = self.raw.read_frame(timeout=max(0.001, deadline - time.monotonic()))
            except ConnectionLost:
                got.append({"method": "(socket closed)", "slow": self._slow()})
                break
            except Timeout:
                got.append({"method": "(still open)"})
                break
            out = method_fields(frame, self.session.names)
            out["slow"] = self._slow()
            got.append(out)
            if isinstance(frame, commands.Connection.Close) and self.answer_close:
                try:
                    self.raw.send_method(0, commands.Connection.CloseOk())
                except OSError:
                    pass
        self.raw.sock.close()
        self.session.steps.append({"conn": self.label, "op": "login.refused", "got": got})
        return got

    def _slow(self) -> bool:
        return time.monotonic() - self.sent >= SLOW_ANSWER


# --- a session: one scenario on one broker -----------------------------------------------


class Session:
    """What a scenario function gets: connections, admin set-up, free-form records."""

    def __init__(
        self, target: Target, sc: Scenario, expected: list[dict[str, Any]] | None = None
    ) -> None:
        self.target = target
        self.scenario = sc
        self.vhost = sc.vhost
        self.expected = expected  # the recorded steps, when replaying
        self.steps: list[dict[str, Any]] = []
        self.names = Placeholders()
        self.conns: list[Conn] = []
        self.refused: list[RefusedLogin] = []
        self.users: list[str] = []

    def expected_step(self, index: int) -> dict[str, Any] | None:
        """The recorded step at `index` (replaying), for how long to wait; never compared."""
        if self.expected is None or index >= len(self.expected):
            return None
        return self.expected[index]

    def connect(
        self,
        user: str | None = None,
        password: str | None = None,
        vhost: str | None = None,
        capabilities: dict[str, bool] | None = None,
        label: str | None = None,
    ) -> Conn:
        """A connection in the scenario's vhost; a refused login or vhost is recorded
        (the returned Conn is then closed)."""
        raw = RawClient(self.target.host, self.target.port, timeout=WAIT)
        label = label or f"c{len(self.conns) + 1}"
        conn = Conn(self, label, raw)
        self.conns.append(conn)
        caps = {
            "authentication_failure_close": True,
            "consumer_cancel_notify": True,
            "basic.nack": True,
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "connection.blocked": True,
            "per_consumer_qos": True,
        }
        caps.update(capabilities or {})
        try:
            tune = raw.handshake(
                user=user or self.target.user,
                password=password or self.target.password,
                capabilities=caps,
                open_connection=False,
            )
            if isinstance(tune, commands.Connection.Close):
                conn.closed = True
                conn._step("connect", None, reply=method_fields(tune, self.names))
                return conn
            raw.send_method(
                0, commands.Connection.Open(virtual_host=self.vhost if vhost is None else vhost)
            )
            ev = conn.wait(0, commands.Connection.OpenOk)
        except (ConnectionLost, Timeout, AssertionError) as exc:
            conn.closed = True
            conn._step("connect", None, reply={"method": "(refused)", "error": type(exc).__name__})
            return conn
        if ev is not None and isinstance(ev.method, commands.Connection.OpenOk):
            raw.opened = True
        conn._step("connect", None, reply=conn._reply(ev))
        return conn

    def refused_login(
        self,
        capable: bool,
        answer_close: bool = True,
        then: list[tuple[int, Any]] | None = None,
        label: str | None = None,
    ) -> RefusedLogin:
        """Start a login with a wrong password (with or without the client's
        `authentication_failure_close` capability; `then`: (channel, method) pairs
        sent in the same write, as a client that does not wait); its answer is
        recorded by the returned RefusedLogin's finish()."""
        label = label or f"refused{len(self.refused) + 1}"
        login = RefusedLogin(self, label, capable, answer_close, then or [])
        self.refused.append(login)
        return login

    def user(self, name: str, password: str, conf: str, write: str, read: str) -> None:
        """A user with these permissions in the scenario's vhost (removed afterwards)."""
        self.target.admin.add_user(name, password)
        self.users.append(name)
        self.target.admin.set_permissions(name, self.vhost, conf, write, read)

    def mask(self, *fields: str) -> None:
        """Mask these method fields from now on (a value that changes between runs of
        the same broker, such as a stream's message_count on RabbitMQ)."""
        self.names.volatile.update(fields)

    def policy(self, name: str, pattern: str, definition: dict, **kw: Any) -> None:
        self.target.admin.set_policy(self.vhost, name, pattern, definition, **kw)

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """A management API request as the scenario's user (`{vhost}` in `path`: the
        scenario's vhost), recorded: the path as written, the status and the JSON body
        (None when empty). For what the API makes that AMQP then sees."""
        if self.target.management is None:
            raise RuntimeError("this target has no management API")
        url = self.target.management.rstrip("/") + path.replace(
            "{vhost}", quote(self.vhost, safe="")
        )
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        credentials = f"{self.target.user}:{self.target.password}".encode()
        req.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        answer = json.loads(raw) if raw.strip() else None
        step = {"op": "http", "request": f"{method} {path}", "status": status}
        step["body"] = plain(answer, self.names)
        self.steps.append(step)
        return step

    def record(self, what: str, value: Any) -> None:
        """A free-form observation (derived by the scenario, the same on both brokers)."""
        self.steps.append({"op": "record", "what": what, "value": plain(value, self.names)})

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


def run(target: Target, sc: Scenario, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one scenario in a fresh vhost of its own; its record. `expected` (the
    recording, when replaying) only tells how many asynchronous events to wait for."""
    admin = target.admin
    admin.delete_vhost(sc.vhost)
    admin.add_vhost(sc.vhost)
    admin.set_permissions(target.user, sc.vhost, ".*", ".*", ".*")
    session = Session(target, sc, None if expected is None else expected.get("steps", []))
    error = None
    try:
        sc.func(session)
    except Exception as exc:  # recorded, so a broken scenario shows in the comparison
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for conn in session.conns:
            try:
                conn.close(record=False)  # teardown: not part of what is compared
            except Exception:
                pass
            try:
                conn.raw.sock.close()
            except OSError:
                pass
        for login in session.refused:
            login.raw.sock.close()
        admin.delete_vhost(sc.vhost)
        for user in session.users:
            admin.delete_user(user)
    record: dict[str, Any] = {"scenario": sc.id, "doc": sc.doc, "steps": session.steps}
    if error:
        record["error"] = error
    return record


# --- comparing -----------------------------------------------------------------------------


def compare(case: str, expected: Any, actual: Any, path: str = "") -> list[Difference]:
    """Differences between two records, path by path (`steps.3.reply.reply_text`:
    list items by index, so allow-list patterns need no brackets)."""
    out: list[Difference] = []
    _diff(case, expected, actual, path, out)
    return out


def _diff(case: str, a: Any, b: Any, path: str, out: list[Difference]) -> None:
    if a == VOLATILE or b == VOLATILE:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if key == "doc":
                continue
            sub = f"{path}.{key}" if path else key
            if key not in b:
                out.append(Difference(case, "missing", sub, a[key], None))
            elif key not in a:
                out.append(Difference(case, "extra", sub, None, b[key]))
            else:
                _diff(case, a[key], b[key], sub, out)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(case, x, y, f"{path}.{i}", out)
        if len(a) > len(b):
            out.append(Difference(case, "missing", f"{path}.{len(b)}-", a[len(b) :], None))
        elif len(b) > len(a):
            out.append(Difference(case, "extra", f"{path}.{len(a)}-", None, b[len(a) :]))
    elif a != b or type(a) is not type(b):
        kind = "status" if path.endswith("reply_code") else "value"
        out.append(Difference(case, kind, path, a, b))


def load_recording(sc: Scenario) -> dict[str, Any] | None:
    return read_json(sc.recording) if sc.recording.exists() else None


def save_recording(sc: Scenario, record: dict[str, Any]) -> None:
    write_json(sc.recording, record)


def select(scenarios: dict[str, Scenario], pattern: str | None) -> list[Scenario]:
    return [s for sid, s in scenarios.items() if pattern is None or fnmatch.fnmatch(sid, pattern)]
