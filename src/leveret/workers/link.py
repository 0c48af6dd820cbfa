"""The channel between two worker processes: ordered records, batched writes.

Each worker owns a share of the queues. A publish is routed by the worker that read
it, and whatever the routing gives to another worker's queues travels here, as do
what comes back (confirms, nacks), what a consumer on one worker says to a queue on
another (acks, rejects, credit) and the metadata changes every worker must apply in
the same order (declarations, bindings), each with an acknowledgement once applied.

Two layers, as in `protocol/`:

- sans-IO: `LinkWriter` turns records into bytes and `LinkReader` bytes into
  records. A record is a 5-byte header (payload length, kind) and a payload. The
  writer only appends; the bytes leave when its owner asks for them, so every record
  queued in one event-loop turn goes out in one write, as the store's group commit
  makes one fsync of many appends.
- `Link`: an `asyncio.Protocol` over one end of an AF_UNIX stream socket pair
  (`socket_pair`). A stream socket keeps order; `Link` flushes once per loop turn
  and pauses its sender (`writable`, `drain`, `on_writable`) while more than
  `high_water` bytes wait for the peer, so a slow peer cannot make this process's
  memory grow without bound.

A message's content is opaque here (`Publish.message`, `Deliver.message`): the
bytes its owner's store encodes, so this module is not a second AMQP codec.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence

try:
    import cython
except ImportError:  # no Cython installed: the annotations below are only comments
    from leveret import _cython_shim as cython

#: record kinds (the byte after the length)
PUBLISH = 1  # a routed message for queues the peer owns
CONFIRM = 2  # the peer took these publishes (durably, if they were persistent)
NACK = 3  # the peer could not take these publishes
ACK = 4  # a consumer's acks of deliveries, to the worker that owns the queue
REJECT = 5  # a consumer's rejects or nacks (flag REQUEUE: put them back)
CREDIT = 6  # more deliveries a consumer may take
DELIVER = 7  # a message for a consumer whose connection the peer serves
META = 8  # a metadata change, applied by every worker in the order sent
META_APPLIED = 9  # the peer applied metadata changes up to this sequence number
REQUEST = 10  # a call the peer answers with one REPLY (consume, purge, a counted get...)
REPLY = 11  # the answer to the REQUEST of the same id

KIND_NAMES = {
    PUBLISH: "publish",
    CONFIRM: "confirm",
    NACK: "nack",
    ACK: "ack",
    REJECT: "reject",
    CREDIT: "credit",
    DELIVER: "deliver",
    META: "meta",
    META_APPLIED: "meta-applied",
    REQUEST: "request",
    REPLY: "reply",
}

#: REJECT flag: requeue the messages; DELIVER flag: the message was delivered before
REQUEUE = 1
REDELIVERED = 1
#: REJECT flag (with REQUEUE): returned by a channel or connection that closed, which
#: a quorum queue puts back at its front (a nack's returns may go to its back)
CLOSING = 2

#: the largest payload a record may have: RabbitMQ's largest message (512 MiB) and room
#: for its routing; a longer length is a broken stream, not a record
MAX_PAYLOAD = (512 << 20) + (1 << 20)

HEADER = struct.Struct(">IB")  # payload length, kind
_PUB = struct.Struct(">QB")  # sequence number, vhost length
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_SETTLE = struct.Struct(">QBI")  # ref, flags, number of runs
_RUN = struct.Struct(">QI")  # first id, count
_CREDIT = struct.Struct(">QI")  # ref, credit
_DELIVER = struct.Struct(">QQB")  # ref, delivery id, flags
_SEQ = struct.Struct(">Q")
_REPLY = struct.Struct(">Q?")  # request id, ok


#: copies of the constants `LinkReader.feed` tests: C integers when compiled (link.pxd)
_C_PUBLISH = PUBLISH
_C_DELIVER = DELIVER
_C_REPLY = REPLY
_C_MAX_PAYLOAD = MAX_PAYLOAD


# Compiled, `LinkReader.feed` reads a record's integers straight out of the bytes with
# these instead of struct's unpack_from; Python runs the struct versions.
@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be16(buf: bytes, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    return (buf[i] << 8) | buf[i + 1]


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be32(buf: bytes, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    return (
        (cython.cast(cython.Py_ssize_t, buf[i]) << 24)
        | (buf[i + 1] << 16)
        | (buf[i + 2] << 8)
        | buf[i + 3]
    )


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be64(buf: bytes, i: cython.Py_ssize_t) -> cython.ulonglong:
    return (cython.cast(cython.ulonglong, _be32(buf, i)) << 32) | cython.cast(
        cython.ulonglong, _be32(buf, i + 4)
    )


class LinkError(Exception):
    """The byte stream is not a sequence of records: the peer is broken, or not a
    worker link. The link cannot resynchronise and must be closed."""


class Publish:
    """A routed message: the queues of `vhost` on the receiving worker that get it.

    `seq` numbers the sender's publishes on this link; the receiver confirms or nacks
    by it (0: the publisher wants no confirm)."""

    __slots__ = ("seq", "vhost", "queues", "message")
    kind = PUBLISH

    def __init__(self, seq: int, vhost: str, queues: Sequence[str], message: bytes) -> None:
        self.seq = seq
        self.vhost = vhost
        self.queues = tuple(queues)
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Publish) and (
            self.seq,
            self.vhost,
            self.queues,
            self.message,
        ) == (other.seq, other.vhost, other.queues, other.message)

    def __repr__(self) -> str:
        return f"Publish({self.seq}, {self.vhost!r}, {self.queues!r}, {len(self.message)} B)"


class Settle:
    """Ids settled together: CONFIRM and NACK (publish sequence numbers, `ref` 0),
    ACK and REJECT (delivery ids of the consumer `ref`).

    Ids are kept as runs (first, count): a confirm of a thousand consecutive
    publishes, or a multiple ack, is one run."""

    __slots__ = ("kind", "ref", "flags", "runs")

    def __init__(
        self, kind: int, ref: int, runs: Sequence[tuple[int, int]], flags: int = 0
    ) -> None:
        if kind not in (CONFIRM, NACK, ACK, REJECT):
            raise ValueError(f"not a settlement kind: {kind}")
        self.kind = kind
        self.ref = ref
        self.flags = flags
        self.runs = list(runs)

    @classmethod
    def of(cls, kind: int, ref: int, ids: Iterable[int], flags: int = 0) -> Settle:
        """The settlement of `ids`, in the order given, as runs of consecutive ids."""
        runs: list[tuple[int, int]] = []
        first = last = -2
        for i in ids:
            if i == last + 1:
                last = i
                continue
            if first >= 0:
                runs.append((first, last - first + 1))
            first = last = i
        if first >= 0:
            runs.append((first, last - first + 1))
        return cls(kind, ref, runs, flags)

    def ids(self) -> Iterator[int]:
        for first, count in self.runs:
            yield from range(first, first + count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settle) and (self.kind, self.ref, self.flags, self.runs) == (
            other.kind,
            other.ref,
            other.flags,
            other.runs,
        )

    def __repr__(self) -> str:
        return f"Settle({KIND_NAMES[self.kind]}, ref={self.ref}, runs={self.runs})"


class Credit:
    """`credit` more deliveries for the consumer `ref`."""

    __slots__ = ("ref", "credit")
    kind = CREDIT

    def __init__(self, ref: int, credit: int) -> None:
        self.ref = ref
        self.credit = credit

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Credit) and (self.ref, self.credit) == (other.ref, other.credit)

    def __repr__(self) -> str:
        return f"Credit({self.ref}, {self.credit})"


class Deliver:
    """A message for the consumer `ref`, whose connection the receiving worker serves;
    it acks or rejects `delivery` with a `Settle` on the way back."""

    __slots__ = ("ref", "delivery", "flags", "message")
    kind = DELIVER

    def __init__(self, ref: int, delivery: int, flags: int, message: bytes) -> None:
        self.ref = ref
        self.delivery = delivery
        self.flags = flags
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deliver) and (
            self.ref,
            self.delivery,
            self.flags,
            self.message,
        ) == (other.ref, other.delivery, other.flags, other.message)

    def __repr__(self) -> str:
        return f"Deliver({self.ref}, {self.delivery}, {self.flags}, {len(self.message)} B)"


class Meta:
    """A metadata change, opaque here; every worker applies them in `seq` order and
    answers with `MetaApplied`, so the sender knows when a change holds everywhere
    (a `queue.declare-ok` waits for that)."""

    __slots__ = ("seq", "change")
    kind = META

    def __init__(self, seq: int, change: bytes) -> None:
        self.seq = seq
        self.change = change

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Meta) and (self.seq, self.change) == (other.seq, other.change)

    def __repr__(self) -> str:
        return f"Meta({self.seq}, {len(self.change)} B)"


class MetaApplied:
    """Every metadata change up to `seq` is applied on the sending worker."""

    __slots__ = ("seq",)
    kind = META_APPLIED

    def __init__(self, seq: int) -> None:
        self.seq = seq

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetaApplied) and self.seq == other.seq

    def __repr__(self) -> str:
        return f"MetaApplied({self.seq})"


class Request:
    """A call to the peer: `body` is opaque here (the caller's encoding of what to do);
    the peer answers with one `Reply` of the same `id`."""

    __slots__ = ("id", "body")
    kind = REQUEST

    def __init__(self, id: int, body: bytes) -> None:
        self.id = id
        self.body = body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and (self.id, self.body) == (other.id, other.body)

    def __repr__(self) -> str:
        return f"Request({self.id}, {len(self.body)} B)"


class Reply:
    """The answer to the `Request` of the same `id`; `ok` False: `body` is an error."""

    __slots__ = ("id", "ok", "body")
    kind = REPLY

    def __init__(self, id: int, ok: bool, body: bytes) -> None:
        self.id = id
        self.ok = ok
        self.body = body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reply) and (self.id, self.ok, self.body) == (
            other.id,
            other.ok,
            other.body,
        )

    def __repr__(self) -> str:
        return f"Reply({self.id}, {self.ok}, {len(self.body)} B)"


Record = Publish | Settle | Credit | Deliver | Meta | MetaApplied | Request | Reply


def _short(text: str, what: str) -> bytes:
    data = text.encode()
    if len(data) > 255:
        raise ValueError(f"{what} longer than 255 bytes: {text[:40]!r}...")
    return data


_HEAD_SEQ = struct.Struct(">IBQ")  # a PUBLISH record's header and sequence number
_HEAD_DELIVER = struct.Struct(">IBQQB")  # a DELIVER record's header and fixed fields
#: the encoded vhost and queue names of PUBLISH records, by (vhost, *queues)
_NAMES: dict[tuple[str, ...], bytes] = {}


def _names(key: tuple[str, ...]) -> bytes:
    v = _short(key[0], "vhost name")
    names = [_short(q, "queue name") for q in key[1:]]
    data = b"".join(
        [_U8.pack(len(v)), v, _U16.pack(len(names))] + [_U8.pack(len(n)) + n for n in names]
    )
    if len(_NAMES) > 4096:
        _NAMES.clear()  # many names once: keep the cache small, not complete
    _NAMES[key] = data
    return data


#: decoded (vhost, queues) of PUBLISH records, by their encoded names
_DECODED: dict[bytes, tuple[str, tuple[str, ...], int]] = {}


class LinkWriter:
    """Records queued as byte chunks until `data_to_send` joins them into one write.

    `pending` is the bytes queued, for the owner's back-pressure accounting.

    The last record queued may be left *open* (`publish_open`, `settle_open`): it
    stays an object, and the next call that would queue the same kind of record
    (the same message to another queue of the peer; another ack of the same
    consumer) adds to it instead (`publish_more`, `settle_more`). Anything else
    queued, or taking the bytes, closes it first, so records keep their order: a
    fan-out to three of the peer's queues is one PUBLISH, and the acks of a loop
    turn are runs in one ACK record, without a later record overtaking them."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self.pending = 0
        self.records = 0
        # The open record: [token, seq, vhost, queues, message] for a PUBLISH,
        # [kind, ref, flags, runs] for a settlement; None when there is none.
        self._open_publish: list | None = None
        self._open_settle: list | None = None
        #: the token of the open PUBLISH (None when there is none): a caller checks
        #: it before calling `publish_more`, which most messages would call for nothing
        self.open_token: object = None

    # --- open records -------------------------------------------------------------

    def publish_open(self, token: object, seq: int, vhost: str, queue: str, message: bytes) -> None:
        """Queue a PUBLISH of `message` (whose identity is `token`) that
        `publish_more` may add queues to while it is the last record."""
        o = self._open_publish
        if o is not None:  # the previous message's: queued as bytes now (`publish`, inline)
            self._open_publish = None
            queues = o[3]
            key = (o[2], queues[0]) if len(queues) == 1 else (o[2], *queues)
            names = _NAMES.get(key)
            if names is None:
                names = _names(key)
            data = o[4]
            size = 8 + len(names) + len(data)
            if size > MAX_PAYLOAD:
                raise ValueError(f"record of {size} bytes is longer than {MAX_PAYLOAD}")
            self._chunks += (_HEAD_SEQ.pack(size, PUBLISH, o[1]), names, data)
            self.pending += 13 + len(names)  # HEADER.size + 8, the message counted already
            self.records += 1
        elif self._open_settle is not None:
            self.close_open()
        self._open_publish = [token, seq, vhost, [queue], message]
        self.open_token = token
        self.pending += len(message)

    def publish_more(self, token: object, vhost: str, queue: str) -> bool:
        """Add `queue` to the open PUBLISH if it is `token`'s in `vhost`; False if
        there is no such record (the caller then opens one)."""
        o = self._open_publish
        if o is None or o[0] is not token or o[2] != vhost:
            return False
        o[3].append(queue)
        return True

    def settle_open(self, kind: int, ref: int, ident: int, flags: int = 0) -> None:
        """Settle `ident` (of `kind` for `ref`): into the open settlement when it is
        the same kind, ref and flags, else in a new open one."""
        o = self._open_settle
        if o is not None and o[0] == kind and o[1] == ref and o[2] == flags:
            runs = o[3]
            last = len(runs) - 1  # (no negative index: the module may be compiled)
            first, count = runs[last]
            if ident == first + count:
                runs[last] = (first, count + 1)
            else:
                runs.append((ident, 1))
            return
        self.close_open()
        self._open_settle = [kind, ref, flags, [(ident, 1)]]
        self.pending += 32

    def close_open(self) -> None:
        """Queue the open record as bytes (nothing can be added to it any more)."""
        o = self._open_publish
        if o is not None:
            self._open_publish = None
            self.open_token = None
            self.pending -= len(o[4])
            self.publish(o[1], o[2], o[3], o[4])
        o = self._open_settle
        if o is not None:
            self._open_settle = None
            self.pending -= 32
            self._add_settle(o[0], o[1], o[2], o[3])

    # --- records ------------------------------------------------------------------

    def _add(self, kind: int, *parts: bytes) -> None:
        if self._open_publish is not None or self._open_settle is not None:
            self.close_open()
        size = sum(len(p) for p in parts)
        if size > MAX_PAYLOAD:
            raise ValueError(f"record of {size} bytes is longer than {MAX_PAYLOAD}")
        self._chunks.append(HEADER.pack(size, kind))
        self._chunks.extend(parts)
        self.pending += HEADER.size + size
        self.records += 1

    def publish(self, seq: int, vhost: str, queues: Sequence[str], message: bytes) -> None:
        """Queue a PUBLISH record (the hot path: no record object is made; the
        vhost and queue names are encoded once per set of names)."""
        key = (vhost, *queues)
        names = _NAMES.get(key)
        if names is None:
            names = _names(key)
        if self._open_publish is not None or self._open_settle is not None:
            self.close_open()
        size = 8 + len(names) + len(message)
        if size > MAX_PAYLOAD:
            raise ValueError(f"record of {size} bytes is longer than {MAX_PAYLOAD}")
        self._chunks += (_HEAD_SEQ.pack(size, PUBLISH, seq), names, message)
        self.pending += HEADER.size + size
        self.records += 1

    def settle(self, kind: int, ref: int, runs: Sequence[tuple[int, int]], flags: int = 0) -> None:
        self.add(Settle(kind, ref, runs, flags))

    def deliver(self, ref: int, delivery: int, flags: int, message: bytes) -> None:
        """Queue a DELIVER record (the hot path: no record object is made, and the
        record's header and fixed fields are packed in one call)."""
        if self._open_publish is not None or self._open_settle is not None:
            self.close_open()
        size = _DELIVER.size + len(message)
        if size > MAX_PAYLOAD:
            raise ValueError(f"record of {size} bytes is longer than {MAX_PAYLOAD}")
        self._chunks += (_HEAD_DELIVER.pack(size, DELIVER, ref, delivery, flags), message)
        self.pending += HEADER.size + size
        self.records += 1

    def add(self, record: Record) -> None:
        """Queue any record."""
        if isinstance(record, Publish):
            self.publish(record.seq, record.vhost, record.queues, record.message)
        elif isinstance(record, Settle):
            self._add_settle(record.kind, record.ref, record.flags, record.runs)
        elif isinstance(record, Credit):
            self._add(CREDIT, _CREDIT.pack(record.ref, record.credit))
        elif isinstance(record, Deliver):
            head = _DELIVER.pack(record.ref, record.delivery, record.flags)
            self._add(DELIVER, head, record.message)
        elif isinstance(record, Meta):
            self._add(META, _SEQ.pack(record.seq), record.change)
        elif isinstance(record, MetaApplied):
            self._add(META_APPLIED, _SEQ.pack(record.seq))
        elif isinstance(record, Request):
            self._add(REQUEST, _SEQ.pack(record.id), record.body)
        elif isinstance(record, Reply):
            self._add(REPLY, _REPLY.pack(record.id, record.ok), record.body)
        else:
            raise TypeError(f"not a link record: {record!r}")

    def _add_settle(self, kind: int, ref: int, flags: int, runs: Sequence[tuple[int, int]]) -> None:
        body = [_SETTLE.pack(ref, flags, len(runs))]
        body.extend(_RUN.pack(first, count) for first, count in runs)
        self._add(kind, b"".join(body))

    def data_to_send(self) -> bytes:
        """Everything queued, as one bytes object; the writer is empty after."""
        if self._open_publish is not None or self._open_settle is not None:
            self.close_open()
        if not self._chunks:
            return b""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self.pending = 0
        return data


def _decode(kind: int, p: memoryview) -> Record:
    try:
        if kind == PUBLISH:
            (seq,) = _SEQ.unpack_from(p, 0)
            vlen = p[8]
            (n,) = _U16.unpack_from(p, 9 + vlen)
            pos = 11 + vlen
            end = pos
            for _ in range(n):
                end += 1 + p[end]
            raw = bytes(p[8:end])
            known = _DECODED.get(raw)
            if known is None:
                vhost = str(p[9 : 9 + vlen], "utf-8")
                queues = []
                for _ in range(n):
                    qlen = p[pos]
                    queues.append(str(p[pos + 1 : pos + 1 + qlen], "utf-8"))
                    pos += 1 + qlen
                if pos > len(p):
                    raise LinkError("publish record shorter than its queue names")
                if len(_DECODED) > 4096:
                    _DECODED.clear()
                known = _DECODED[raw] = (vhost, tuple(queues), pos)
            vhost, names, pos = known
            return Publish(seq, vhost, names, bytes(p[pos:]))
        if kind in (CONFIRM, NACK, ACK, REJECT):
            ref, flags, nruns = _SETTLE.unpack_from(p, 0)
            if len(p) != _SETTLE.size + nruns * _RUN.size:
                raise LinkError(f"{KIND_NAMES[kind]} record of {len(p)} bytes for {nruns} runs")
            runs = [_RUN.unpack_from(p, _SETTLE.size + i * _RUN.size) for i in range(nruns)]
            return Settle(kind, ref, runs, flags)
        if kind == CREDIT:
            return Credit(*_CREDIT.unpack(p))
        if kind == DELIVER:
            ref, delivery, flags = _DELIVER.unpack_from(p, 0)
            return Deliver(ref, delivery, flags, bytes(p[_DELIVER.size :]))
        if kind == META:
            return Meta(_SEQ.unpack_from(p, 0)[0], bytes(p[_SEQ.size :]))
        if kind == META_APPLIED:
            return MetaApplied(*_SEQ.unpack(p))
        if kind == REQUEST:
            return Request(_SEQ.unpack_from(p, 0)[0], bytes(p[_SEQ.size :]))
        if kind == REPLY:
            rid, ok = _REPLY.unpack_from(p, 0)
            return Reply(rid, ok, bytes(p[_REPLY.size :]))
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise LinkError(f"malformed {KIND_NAMES[kind]} record: {exc}") from exc
    raise LinkError(f"unknown record kind {kind}")


class LinkReader:
    """Bytes in, records out; a record cut between reads waits for its rest."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.records = 0
        # (names bytes, vhost, queues, offset of the message) of the last PUBLISH
        # whose names were known: a publisher's records mostly repeat them
        self._last_names: tuple[bytes, str, tuple[str, ...], int] | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        """The whole records `data` completes, in order. Raises `LinkError` for bytes
        that are not records (the stream is then unusable).

        The records are cut from one bytes object by slicing (a record's content is
        one copy); PUBLISH and DELIVER, one or two per message, are decoded here
        rather than through `_decode`. Compiled, the integers of their headers are
        read in C (every read below is inside a length checked before it)."""
        buf = self._buffer
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        raw: bytes = data  # type: ignore[assignment]
        out: list[Record] = []
        pos: cython.Py_ssize_t = 0
        end: cython.Py_ssize_t = len(raw)
        size: cython.Py_ssize_t
        kind: cython.Py_ssize_t
        start: cython.Py_ssize_t
        q: cython.Py_ssize_t
        n: cython.Py_ssize_t
        offset: cython.Py_ssize_t
        try:
            while end - pos >= 5:  # HEADER.size
                if cython.compiled:
                    size = _be32(raw, pos)
                    kind = raw[pos + 4]
                else:
                    size, kind = HEADER.unpack_from(raw, pos)
                if size > _C_MAX_PAYLOAD:
                    raise LinkError(f"record length {size} is over {MAX_PAYLOAD}")
                if kind < _C_PUBLISH or kind > _C_REPLY:  # (the kinds are 1 to 11)
                    raise LinkError(f"unknown record kind {kind}")
                start = pos + 5
                if end - start < size:
                    break
                pos = start + size
                if kind == _C_DELIVER and size >= 17:  # _DELIVER.size
                    if cython.compiled:
                        out.append(
                            Deliver(
                                _be64(raw, start),
                                _be64(raw, start + 8),
                                raw[start + 16],
                                raw[start + 17 : pos],
                            )
                        )
                    else:
                        ref, delivery, flags = _DELIVER.unpack_from(raw, start)
                        out.append(Deliver(ref, delivery, flags, raw[start + 17 : pos]))
                    continue
                if kind == _C_PUBLISH and size >= 11:
                    # The names (vhost, queues) of a publisher's records repeat: the
                    # last record's are compared in place (their encoding delimits
                    # itself, so a prefix that matches is the whole of them), others
                    # decoded before are found by their bytes (_DECODED); new ones go
                    # through _decode, which checks and caches them.
                    last = self._last_names
                    if last is not None:
                        offset = last[3]
                        if start + offset <= pos and raw.startswith(last[0], start + 8):
                            out.append(
                                Publish(
                                    _be64(raw, start)
                                    if cython.compiled
                                    else _SEQ.unpack_from(raw, start)[0],
                                    last[1],
                                    last[2],
                                    raw[start + offset : pos],
                                )
                            )
                            continue
                    q = start + 11 + raw[start + 8]
                    if q <= pos:
                        n = (
                            _be16(raw, q - 2)
                            if cython.compiled
                            else _U16.unpack_from(raw, q - 2)[0]
                        )
                        while n > 0 and q < pos:
                            q += 1 + raw[q]
                            n -= 1
                        names = raw[start + 8 : q] if q <= pos else b""
                        known = _DECODED.get(names) if names else None
                        if known is not None:
                            vhost, queues, offset = known
                            self._last_names = (names, vhost, queues, offset)
                            seq = (
                                _be64(raw, start)
                                if cython.compiled
                                else _SEQ.unpack_from(raw, start)[0]
                            )
                            out.append(Publish(seq, vhost, queues, raw[start + offset : pos]))
                            continue
                out.append(_decode(kind, memoryview(raw)[start:pos]))
        except struct.error as exc:
            raise LinkError(f"malformed record: {exc}") from exc
        if pos < end:
            buf += memoryview(raw)[pos:]
        self.records += len(out)
        return out


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected AF_UNIX stream pair: one end for each worker of a pair (made before
    the workers start, each keeping its end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


OnRecords = Callable[[list[Record]], None]

#: bytes waiting for the peer above which the sender is paused; 1 MiB is a few hundred
#: batches of small publishes, and about what the kernel buffers for the socket itself
DEFAULT_HIGH_WATER = 1 << 20
#: queued bytes that are written at once rather than at the turn's end: a batch is a
#: loop turn's records, up to this much
DEFAULT_BATCH_LIMIT = 256 << 10


class Link(asyncio.Protocol):
    """One worker's end of a link, in its event loop.

    `send` (and `publish`) queue a record and arrange one flush at the next loop
    turn: what a turn queues leaves in one write (or one per `batch_limit` bytes,
    for a sender that queues more in one turn). Received records go to
    `on_records`, a list per read, in the order sent.

    Back-pressure: while more than `high_water` bytes wait for the peer (in this
    transport's buffer, the kernel's being full), `writable` is False, `drain()`
    waits, and `on_writable(False)` tells the owner, which stops reading its clients
    as the broker does for a queue backlog; `on_writable(True)` when the waiting
    bytes fall to a quarter of it. The owner that keeps sending while paused keeps
    what it sends in memory: pausing is the owner's to honour."""

    def __init__(
        self,
        on_records: OnRecords,
        *,
        high_water: int = DEFAULT_HIGH_WATER,
        batch_limit: int = DEFAULT_BATCH_LIMIT,
        on_writable: Callable[[bool], None] | None = None,
        on_lost: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self.on_records = on_records
        self.batch_limit = batch_limit
        self.on_writable = on_writable
        self.on_lost = on_lost
        self.high_water = high_water
        self.writer = LinkWriter()
        self.reader = LinkReader()
        self.transport: asyncio.Transport | None = None
        self.writable = True
        self.closed = False
        self.error: BaseException | None = None  # what broke the stream, if it broke
        self.writes = 0  # flushes that wrote something: records sent / writes = batching
        self.pauses = 0  # times the sender was paused
        self._flush_scheduled = False
        self._drain: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's do not subclass asyncio.Transport, so no check.
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        transport.set_write_buffer_limits(high=self.high_water, low=self.high_water // 4)

    def data_received(self, data: bytes) -> None:
        try:
            records = self.reader.feed(data)
        except LinkError as exc:
            self._fail(exc)
            return
        if records:
            self.on_records(records)

    def eof_received(self) -> bool:
        return False  # close our end too: a link is only useful both ways

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        exc = exc or self.error  # a broken stream is why the link closed
        self._wake(exc or ConnectionResetError("worker link closed"))
        if self.on_lost is not None:
            self.on_lost(exc)

    def pause_writing(self) -> None:
        self.writable = False
        self.pauses += 1
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        self.writable = True
        self._wake(None)
        if self.on_writable is not None:
            self.on_writable(True)

    # sending

    def send(self, record: Record) -> None:
        """Queue `record`; it leaves with the rest of this loop turn's records.
        Raises ConnectionResetError once the link is closed (nothing would take it)."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        self.writer.add(record)
        self._schedule()

    def publish(self, seq: int, vhost: str, queues: Sequence[str], message: bytes) -> None:
        """Queue a PUBLISH without making a `Publish` object."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        self.writer.publish(seq, vhost, queues, message)
        if not self._flush_scheduled or self.writer.pending >= self.batch_limit:
            self._schedule()  # (else a flush is due at the turn's end already)

    def deliver(self, ref: int, delivery: int, flags: int, message: bytes) -> None:
        """Queue a DELIVER without making a `Deliver` object."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        self.writer.deliver(ref, delivery, flags, message)
        if not self._flush_scheduled or self.writer.pending >= self.batch_limit:
            self._schedule()  # (else a flush is due at the turn's end already)

    def publish_open(self, token: object, seq: int, vhost: str, queue: str, message: bytes) -> None:
        """Queue a PUBLISH that `writer.publish_more` may still add queues to."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        self.writer.publish_open(token, seq, vhost, queue, message)
        if not self._flush_scheduled or self.writer.pending >= self.batch_limit:
            self._schedule()  # (else a flush is due at the turn's end already)

    def settle_open(self, kind: int, ref: int, ident: int, flags: int = 0) -> None:
        """Settle one id; the ids of a loop turn join into runs of one record."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        self.writer.settle_open(kind, ref, ident, flags)
        if not self._flush_scheduled or self.writer.pending >= self.batch_limit:
            self._schedule()  # (else a flush is due at the turn's end already)

    def _schedule(self) -> None:
        if self.writer.pending >= self.batch_limit:
            # A sender that queues a batch this large in one turn gets it written now,
            # so the transport (and its pause_writing) sees it: a loop that only checks
            # `writable` never lets the turn end.
            self.flush()
            return
        if not self._flush_scheduled and not self.closed:
            self._flush_scheduled = True
            assert self._loop is not None, "link not connected"
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now (a loop turn's end does it anyway)."""
        self._flush_scheduled = False
        data = self.writer.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)
            self.writes += 1

    @property
    def buffered(self) -> int:
        """Bytes this side holds for the peer: queued records and the transport's
        unsent buffer."""
        size = self.writer.pending
        if self.transport is not None and not self.closed:
            size += self.transport.get_write_buffer_size()
        return size

    async def drain(self) -> None:
        """Return once the sender may go on (at once unless paused); raises if the link
        is lost meanwhile."""
        if self.closed:
            raise ConnectionResetError("worker link closed")
        if self.writable:
            return
        if self._drain is None:
            assert self._loop is not None
            self._drain = self._loop.create_future()
        await asyncio.shield(self._drain)

    def _wake(self, exc: BaseException | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
                waiter.exception()  # retrieved: a drain nobody awaits is no error

    # receiving

    def pause_reading(self) -> None:
        """Stop taking records (the kernel's buffer then fills and pauses the peer)."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Send what is queued, then close."""
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        if self.transport is not None:
            self.transport.abort()
        self.closed = True
        self._wake(exc)


async def open_link(
    sock: socket.socket,
    on_records: OnRecords,
    *,
    high_water: int = DEFAULT_HIGH_WATER,
    batch_limit: int = DEFAULT_BATCH_LIMIT,
    on_writable: Callable[[bool], None] | None = None,
    on_lost: Callable[[BaseException | None], None] | None = None,
) -> Link:
    """A `Link` over `sock` (one end of `socket_pair()`) in the running loop."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    _, link = await loop.create_unix_connection(
        lambda: Link(
            on_records,
            high_water=high_water,
            batch_limit=batch_limit,
            on_writable=on_writable,
            on_lost=on_lost,
        ),
        sock=sock,
    )
    return link
