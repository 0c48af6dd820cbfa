"""The URIs of shovels and federation upstreams, read as RabbitMQ reads them.

They follow RabbitMQ's amqp_uri rather than leveret.client's URL parser,
because definitions are written for RabbitMQ:

- no host (`amqp://`, `amqp:///vhost`, `amqp://user:pass@/vhost`) means this
  broker itself (a *direct* connection, leveret.links.direct);
- a missing path gives the default vhost (`/` for shovels, the downstream's
  vhost for federation); `amqp://host/` names the vhost "", as in RabbitMQ;
- query options RabbitMQ does not know are ignored (RabbitMQ ignores them);
  the integer ones it knows must be integers; `connection_timeout` is in ms.

Problems are reported with RabbitMQ's reason terms, e.g.
`{{unexpected_uri_scheme,"http"},"http://x"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl

from leveret.broker.erlang_terms import string
from leveret.client.url import DEFAULT_PORTS, ConnectionParameters

INTEGER_OPTIONS = {
    "heartbeat": "heartbeat",
    "channel_max": "channel_max",
    "frame_max": "frame_max",
    "connection_timeout": "connect_timeout",
}
TLS_OPTIONS = {
    "cacertfile": "cafile",
    "certfile": "certfile",
    "keyfile": "keyfile",
    "server_name_indication": "server_hostname",
}


class URIError(ValueError):
    """`str(error)` is RabbitMQ's reason term for the URI."""


@dataclass(frozen=True)
class LinkURI:
    uri: str  # as given (with credentials: never shown)
    safe: str  # without credentials, for status and headers (amqp_uri:remove_credentials)
    direct: bool  # no host: this broker
    vhost: str
    username: str | None  # None: direct without a user (trusted, as RabbitMQ's "none")
    password: str | None
    params: ConnectionParameters | None  # for a network URI


def _unescape(text: str, uri: str) -> str:
    out = bytearray()
    i = 0
    raw = text.encode()
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # %
            pair = raw[i + 1 : i + 3]
            try:
                if len(pair) < 2:
                    raise ValueError
                out.append(int(pair, 16))
            except ValueError:
                chars = ",".join(str(b) for b in pair)
                detail = f"['%',{chars}]" if len(pair) == 2 else string("%" + pair.decode())
                kind = "invalid_entitiy" if len(pair) == 2 else "unterminated_entity"
                raise URIError(f"{{{{{kind},{detail}}},{string(uri)}}}") from None
            i += 3
        else:
            out.append(c)
            i += 1
    return out.decode("utf-8", "replace")


def parse(uri: str, default_vhost: str = "/") -> LinkURI:
    """A shovel's or upstream's URI; URIError with RabbitMQ's reason."""
    q = string(uri)
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise URIError(f"{{{{unable_to_parse_uri,no_scheme}},{q}}}")
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise URIError(f"{{{{unexpected_uri_scheme,{string(scheme)}}},{q}}}")
    rest, _, query = rest.partition("?")
    rest, _, _fragment = rest.partition("#")
    authority, slash, path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        userinfo, hostport = "", authority
    if hostport.startswith("["):
        end = hostport.find("]")
        host, port_text = hostport[1:end], hostport[end + 1 :].lstrip(":")
    else:
        host, _, port_text = hostport.partition(":")
    port: int | None = None
    if port_text:
        try:
            port = int(port_text)
        except ValueError:
            raise URIError(f"{{{{unable_to_parse_uri,{{malformed_uri,{q}}}}},{q}}}") from None
        if not 0 < port <= 65535:
            raise URIError(f"{{{{port_out_of_range,{port}}},{q}}}")
    if slash:
        if "/" in path:
            raise URIError(f"{{{{invalid_vhost,{string(path)}}},{q}}}")
        vhost = _unescape(path, uri)
    else:
        vhost = default_vhost
    username = password = None
    if userinfo:
        user, colon, pw = userinfo.partition(":")
        username = _unescape(user, uri)
        password = _unescape(pw, uri) if colon else None
    options: dict[str, object] = {}
    pairs = parse_qsl(query, keep_blank_values=True)
    for key, value in pairs:
        if key in INTEGER_OPTIONS:
            try:
                number = int(value)
            except ValueError:
                table = "[" + ",".join("{" + string(k) + "," + string(v) + "}" for k, v in pairs)
                raise URIError(
                    f"{{{{invalid_amqp_params_parameter,{key},{string(value)},{table}],"
                    f"{{not_an_integer,{string(value)}}}}},{q}}}"
                ) from None
            if key == "connection_timeout":
                options["connect_timeout"] = max(number, 1) / 1000
            else:
                options[INTEGER_OPTIONS[key]] = number
        elif scheme == "amqps" and key in TLS_OPTIONS:
            options[TLS_OPTIONS[key]] = value
        elif scheme == "amqps" and key == "verify":
            options["verify"] = value != "verify_none"
    if not host:
        if port is not None:
            raise URIError(f"{{port_requires_host,{q}}}")
        if scheme == "amqps":
            raise URIError(f"{{{{badrecord,amqp_params_direct}},{q}}}")
        return LinkURI(uri, remove_credentials(uri), True, vhost, username, password, None)
    params = ConnectionParameters(
        hosts=((host, port or DEFAULT_PORTS[scheme]),),
        username="guest" if username is None else username,
        password="guest" if password is None else password,
        vhost=vhost,
        tls=scheme == "amqps",
    ).with_options(**options)
    return LinkURI(uri, remove_credentials(uri), False, vhost, username, password, params)


def check(uri: str) -> str | None:
    """None if `uri` is valid, else RabbitMQ's text `"uri" not a valid URI: reason`."""
    try:
        parse(uri)
    except URIError as exc:
        return f"{string(uri)} not a valid URI: {exc}"
    except ValueError as exc:  # a client option out of range (frame_max=1, ...)
        return f"{string(uri)} not a valid URI: {exc}"
    return None


def remove_credentials(uri: str) -> str:
    """The URI without `user:password@`, as RabbitMQ shows it."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    authority, slash, tail = rest.partition("/")
    query = ""
    if not slash:
        authority, qmark, query_rest = authority.partition("?")
        query = qmark + query_rest
    if "@" in authority:
        authority = authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{tail}{query}"
