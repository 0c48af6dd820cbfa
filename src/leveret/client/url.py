"""Connection URLs: `amqp://` and `amqps://`, RabbitMQ's URI spec plus a host list.

    amqp://user:password@host:5672/vhost?heartbeat=10&connection_name=worker-1
    amqp://user:password@host-a:5672,host-b:5672/%2F          (fail-over, in order)
    amqps://host/%2F?cafile=/etc/ca.pem&certfile=c.pem&keyfile=k.pem

Every query option is checked: a misspelt one is an error, not silently ignored.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote

from leveret.client.errors import InvalidURL
from leveret.protocol.constants import FRAME_MIN_SIZE

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}


@dataclass(frozen=True)
class ConnectionParameters:
    """Everything needed to (re)open a connection. Build it with `parse_url()`."""

    hosts: tuple[tuple[str, int], ...] = (("127.0.0.1", 5672),)
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    heartbeat: int | None = None  # None: take the broker's suggestion
    frame_max: int = 131072
    channel_max: int = 2047
    connection_name: str | None = None
    connect_timeout: float = 10.0
    tls: bool = False
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_hostname: str | None = None
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    # Opens the transport instead of a TCP connection: an async callable
    # (protocol_factory, host, port) -> (transport, protocol). leveret.links uses
    # it to reach the broker it runs in without a socket (leveret.links.direct).
    connector: Callable[..., Awaitable[Any]] | None = field(default=None, compare=False)

    def ssl_for(self, host: str) -> tuple[ssl.SSLContext | None, str | None]:
        """The SSL context and SNI name for one host (None, None without TLS)."""
        if not self.tls:
            return None, None
        ctx = self.ssl_context
        if ctx is None:
            ctx = ssl.create_default_context(cafile=self.cafile)
            if self.certfile:
                ctx.load_cert_chain(self.certfile, self.keyfile)
            if not self.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        return ctx, self.server_hostname or host

    def with_options(self, **options: Any) -> ConnectionParameters:
        """A copy with keyword options applied and checked, as for query options."""
        clean = {k: v for k, v in options.items() if v is not None}
        for name, value in clean.items():
            if name not in _FIELDS:
                raise InvalidURL(f"unknown connection option {name!r}")
            if name in _INT_OPTIONS:
                _check_int(name, value)
        return replace(self, **clean)


_FIELDS = {f.name for f in ConnectionParameters.__dataclass_fields__.values()}
_INT_OPTIONS = {
    "heartbeat": (0, 65535),
    "frame_max": (FRAME_MIN_SIZE, 2**32 - 1),
    "channel_max": (1, 65535),
}
_QUERY_ALIASES = {
    "connection_timeout": "connect_timeout",
    "connect_timeout": "connect_timeout",
    "heartbeat": "heartbeat",
    "frame_max": "frame_max",
    "channel_max": "channel_max",
    "connection_name": "connection_name",
    "name": "connection_name",
    "cafile": "cafile",
    "cacertfile": "cafile",
    "certfile": "certfile",
    "keyfile": "keyfile",
    "verify": "verify",
    "server_name_indication": "server_hostname",
}


def _check_int(name: str, value: Any) -> int:
    low, high = _INT_OPTIONS[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidURL(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidURL(f"{name} must be between {low} and {high}, got {value}")
    return value


def _parse_host(text: str, default_port: int, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        end = text.find("]")
        if end < 0:
            raise InvalidURL(f"unclosed '[' in host {text!r} of {url!r}")
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise InvalidURL(f"junk after ']' in host {text!r} of {url!r}")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise InvalidURL(f"empty host name in {url!r}")
    if not port_text:
        return unquote(host), default_port
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidURL(f"port {port_text!r} in {url!r} is not a number") from None
    if not 0 < port < 65536:
        raise InvalidURL(f"port {port} in {url!r} is out of range (1-65535)")
    return unquote(host), port


def parse_url(url: str) -> ConnectionParameters:
    """ConnectionParameters for an amqp:// or amqps:// URL; InvalidURL says what is wrong."""
    if not isinstance(url, str):
        raise InvalidURL(f"a connection URL must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidURL(f"{url!r} is not a URL: expected amqp://host or amqps://host")
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL(f"unsupported scheme {scheme!r} in {url!r}: expected amqp or amqps")
    rest, _, query = rest.partition("?")
    rest, _, _fragment = rest.partition("#")
    authority, slash, path = rest.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    if not at:
        userinfo, hostlist = "", authority
    username = password = None
    if userinfo:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user)
        password = unquote(pw) if colon else None
    default_port = DEFAULT_PORTS[scheme]
    if hostlist:
        hosts = tuple(_parse_host(h, default_port, url) for h in hostlist.split(","))
    else:
        hosts = (("127.0.0.1", default_port),)
    if "/" in path:
        raise InvalidURL(f"vhost {path!r} in {url!r} contains '/': write it URL-encoded (%2F)")
    vhost = unquote(path) if slash and path else "/"
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        name = _QUERY_ALIASES.get(key)
        if name is None:
            known = ", ".join(sorted(set(_QUERY_ALIASES)))
            raise InvalidURL(f"unknown option {key!r} in {url!r}; known: {known}")
        if name in _INT_OPTIONS:
            try:
                number = int(value)
            except ValueError:
                raise InvalidURL(f"{key} must be an integer, got {value!r}") from None
            options[name] = _check_int(name, number)
        elif name == "connect_timeout":
            try:
                seconds = float(value)
            except ValueError:
                raise InvalidURL(f"{key} must be a number of seconds, got {value!r}") from None
            if seconds <= 0:
                raise InvalidURL(f"{key} must be positive, got {value!r}")
            # RabbitMQ's URI spec gives connection_timeout in milliseconds.
            options[name] = seconds / 1000 if key == "connection_timeout" else seconds
        elif name == "verify":
            lowered = value.lower()
            if lowered not in ("verify_peer", "verify_none", "true", "false", "1", "0"):
                raise InvalidURL(f"verify must be verify_peer or verify_none, got {value!r}")
            options[name] = lowered in ("verify_peer", "true", "1")
        else:
            options[name] = value
    if scheme == "amqp" and any(
        k in options for k in ("cafile", "certfile", "keyfile", "verify", "server_hostname")
    ):
        raise InvalidURL(f"TLS options given in {url!r} but the scheme is amqp, not amqps")
    return ConnectionParameters(
        hosts=hosts,
        username="guest" if username is None else username,
        password="guest" if password is None else password,
        vhost=vhost,
        tls=scheme == "amqps",
        **options,
    )


def parse_urls(urls: str | list[str] | tuple[str, ...]) -> ConnectionParameters:
    """One URL, or several (their hosts tried in order; the rest from the first)."""
    if isinstance(urls, str):
        return parse_url(urls)
    if not urls:
        raise InvalidURL("no connection URL given")
    params = [parse_url(u) for u in urls]
    hosts = tuple(h for p in params for h in p.hosts)
    return replace(params[0], hosts=hosts)
