"""A published message, shared by every queue it was routed to."""

from __future__ import annotations

from typing import Any

from leveret.protocol.properties import (
    FLAG_HEADERS,
    FLAG_PRIORITY,
    decode_properties,
    headers_table,
)


class Message:
    """One published message.

    `header` is the content header payload exactly as the publisher sent it;
    deliveries forward it untouched. Properties are decoded only when routing
    or an extension needs them, and cached.
    """

    __slots__ = (
        "exchange",
        "routing_key",
        "header",
        "body",
        "flags",
        "persistent",
        "exchange_and_key",
        "routing_keys",
        "size",
        "ttl",
        "_properties",
        "_headers",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: bytes | None,  # None: paged out (see paged_copy)
        flags: int,
        persistent: bool,
        exchange_and_key: bytes | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        # Body size in bytes, also while the body is paged out (then read from the header).
        self.size = len(body) if body is not None else int.from_bytes(header[4:12], "big")
        self.flags = flags
        self.persistent = persistent
        # basic.deliver / get-ok carry these two short strings; encode them once.
        if exchange_and_key is None:
            ex = exchange.encode()
            rk = routing_key.encode()
            exchange_and_key = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
        self.exchange_and_key = exchange_and_key
        self.routing_keys: list[str] | None = None  # set when CC/BCC add keys
        self.ttl: int | None = None  # per-message `expiration`, ms
        self._properties = None
        self._headers: dict[str, Any] | None | bool = False

    def paged_copy(self) -> Message:
        """A copy without the body, for one queue entry whose body now lives on disk."""
        copy = Message(
            self.exchange,
            self.routing_key,
            self.header,
            None,
            self.flags,
            self.persistent,
        )
        copy.routing_keys = self.routing_keys
        copy.ttl = self.ttl
        return copy

    def copy_with_body(self, body: bytes) -> Message:
        copy = self.paged_copy()
        copy.body = body
        return copy

    @property
    def properties(self):
        if self._properties is None:
            self._properties = decode_properties(self.header)
        return self._properties

    @property
    def headers(self) -> dict[str, Any] | None:
        if self._headers is False:
            self._headers = headers_table(self.header, self.flags)
        return self._headers  # type: ignore[return-value]

    @property
    def priority(self) -> int:
        return self.properties.priority or 0 if self.flags & FLAG_PRIORITY else 0

    @property
    def has_headers(self) -> bool:
        return bool(self.flags & FLAG_HEADERS)

    def set_header(self, header: bytes) -> None:
        """Install a header the broker rewrote (see properties.rewrite_header)."""
        self.header = header
        self.flags = int.from_bytes(header[12:14], "big")
        self._properties = None
        self._headers = False
