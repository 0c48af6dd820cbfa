"""Connection URLs: what parses, and the clear errors for what does not."""

from __future__ import annotations

import pytest

from leveret.client import InvalidURL, parse_url
from leveret.client.url import parse_urls


def test_defaults():
    p = parse_url("amqp://")
    assert p.hosts == (("127.0.0.1", 5672),)
    assert (p.username, p.password, p.vhost, p.tls) == ("guest", "guest", "/", False)


def test_everything():
    p = parse_url(
        "amqp://us%40er:p%3Ass@broker.example:5673/my%2Fvhost"
        "?heartbeat=15&frame_max=65536&channel_max=100&connection_name=worker-1"
        "&connection_timeout=2500"
    )
    assert p.hosts == (("broker.example", 5673),)
    assert (p.username, p.password, p.vhost) == ("us@er", "p:ss", "my/vhost")
    assert (p.heartbeat, p.frame_max, p.channel_max) == (15, 65536, 100)
    assert p.connection_name == "worker-1"
    assert p.connect_timeout == 2.5  # RabbitMQ's URI spec: milliseconds


def test_vhost_forms():
    assert parse_url("amqp://h/%2F").vhost == "/"
    assert parse_url("amqp://h/").vhost == "/"
    assert parse_url("amqp://h/prod").vhost == "prod"


def test_several_hosts_and_ipv6():
    p = parse_url("amqp://u:p@a:1,b,[::1]:3/v")
    assert p.hosts == (("a", 1), ("b", 5672), ("::1", 3))
    q = parse_urls(["amqp://u:p@a/v", "amqp://x:y@b:2/other"])
    assert q.hosts == (("a", 5672), ("b", 2)) and q.username == "u" and q.vhost == "v"


def test_amqps_and_tls_options():
    p = parse_url("amqps://h?cafile=/ca.pem&certfile=/c.pem&keyfile=/k.pem&verify=verify_none")
    assert p.tls and p.hosts == (("h", 5671),)
    assert (p.cafile, p.certfile, p.keyfile, p.verify) == ("/ca.pem", "/c.pem", "/k.pem", False)
    p = parse_url("amqps://h?server_name_indication=broker.internal")
    assert p.verify and p.server_hostname == "broker.internal"


@pytest.mark.parametrize(
    "url,message",
    [
        ("http://host/", "unsupported scheme 'http'"),
        ("localhost:5672", "is not a URL"),
        ("amqp://host:notaport/", "port 'notaport'"),
        ("amqp://host:70000/", "out of range"),
        ("amqp://host/?heartbeet=5", "unknown option 'heartbeet'"),
        ("amqp://host/?heartbeat=soon", "heartbeat must be an integer"),
        ("amqp://host/?heartbeat=-1", "heartbeat must be between 0 and 65535"),
        ("amqp://host/?frame_max=100", "frame_max must be between 4096"),
        ("amqp://host/?channel_max=0", "channel_max must be between 1"),
        ("amqp://host/?connection_timeout=0", "must be positive"),
        ("amqp://host/a/b", "contains '/'"),
        ("amqp://host/?cafile=/ca.pem", "scheme is amqp, not amqps"),
        ("amqps://host/?verify=maybe", "verify must be"),
        ("amqp://a,,b/", "empty host name"),
        ("amqp://[::1/", "unclosed '['"),
    ],
)
def test_bad_urls_say_what_is_wrong(url, message):
    with pytest.raises(InvalidURL, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_url(url)


def test_invalid_url_is_a_value_error_and_not_a_string():
    with pytest.raises(ValueError):
        parse_url("ftp://x")
    with pytest.raises(InvalidURL, match="must be a string"):
        parse_url(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidURL, match="no connection URL"):
        parse_urls([])


def test_keyword_options_are_checked():
    p = parse_url("amqp://h")
    assert p.with_options(heartbeat=5, connection_name="x").heartbeat == 5
    with pytest.raises(InvalidURL, match="heartbeat must be between"):
        p.with_options(heartbeat=100000)
    with pytest.raises(InvalidURL, match="unknown connection option"):
        p.with_options(colour="red")
