"""Vhosts, users and permissions over AMQP, as RabbitMQ checks them.

Every reply code and text here was taken from RabbitMQ 3.10 running the same
client code; run this file with LEVERET_TEST_URL set to check it against the
reference RabbitMQ again (users and vhosts are then made through its HTTP API).
"""

from __future__ import annotations

from urllib.parse import urlparse

import pika
import pika.exceptions
import pytest

from access_setup import LeveretOperator, RabbitOperator, unique
from conftest import EXTERNAL_URL

PASSWORD = "pw-1"


@pytest.fixture
def operator(request):
    if EXTERNAL_URL:
        op = RabbitOperator()
        yield op
        op.cleanup()
    else:
        yield LeveretOperator(request.getfixturevalue("leveret_embedded"))


@pytest.fixture
def port(amqp_url: str) -> int:
    return urlparse(amqp_url).port or 5672


@pytest.fixture
def tenant(operator):
    """A vhost and a user 'bob' whose resources must start with 'bob-'."""
    vhost, user = unique("v"), unique("bob")
    operator.add_vhost(vhost)
    operator.add_user(user, PASSWORD)
    operator.set_permissions(user, vhost, "^bob-", "^bob-", "^bob-")
    return vhost, user


def connect(port: int, user: str, vhost: str, password: str = PASSWORD):
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        vhost,
        pika.PlainCredentials(user, password),
        connection_attempts=1,
        socket_timeout=5,
    )
    return pika.BlockingConnection(params)


def refused(port: int, user: str, vhost: str, action) -> tuple[int, str]:
    """Run `action(channel)` as `user`; the channel must be closed with an error."""
    conn = connect(port, user, vhost)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            action(ch)
        return info.value.reply_code, info.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def allowed(port: int, user: str, vhost: str, action) -> None:
    conn = connect(port, user, vhost)
    try:
        action(conn.channel())
    finally:
        conn.close()


def denied_text(kind: str, name: str, vhost: str, user: str) -> str:
    return (
        f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"
    )


# --- logging in and opening a vhost ------------------------------------------------


def test_wrong_password_and_unknown_user_get_the_same_403(port, tenant):
    vhost, user = tenant
    text = (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    for name, password in ((user, "wrong"), (unique("nobody"), PASSWORD)):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            connect(port, name, vhost, password)
        assert str(info.value) == f"ConnectionClosedByBroker: (403) '{text}'"


def test_a_vhost_that_does_not_exist_is_530(port, tenant):
    _vhost, user = tenant
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(port, user, "no-such-vhost")
    assert "(530) 'NOT_ALLOWED - vhost no-such-vhost not found'" in str(info.value)


def test_a_vhost_without_permissions_is_530(port, operator, tenant):
    vhost, _user = tenant
    other = unique("carol")
    operator.add_user(other, PASSWORD)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(port, other, vhost)
    assert f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{other}'" in str(info.value)


# --- configure -------------------------------------------------------------------


def test_declaring_a_queue_needs_configure(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.queue_declare("other-q"))
    assert (code, text) == (403, denied_text("queue", "other-q", vhost, user))
    allowed(port, user, vhost, lambda ch: ch.queue_declare("bob-q", auto_delete=True))


def test_a_server_named_queue_is_checked_under_its_generated_name(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.queue_declare(""))
    assert code == 403
    assert text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
    assert text.endswith(f"' in vhost '{vhost}' refused for user '{user}'")


def test_the_reserved_prefix_is_refused_before_permissions(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.queue_declare("amq.foo"))
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'",
    )


def test_declaring_an_exchange_needs_configure_but_passive_does_not(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.exchange_declare("other-x", "direct"))
    assert (code, text) == (403, denied_text("exchange", "other-x", vhost, user))
    allowed(port, user, vhost, lambda ch: ch.exchange_declare("amq.direct", "direct", passive=True))


def test_deleting_a_system_exchange_is_refused_first(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.exchange_delete("amq.direct"))
    assert (code, text) == (
        403,
        f"ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '{vhost}' not allowed",
    )


def test_deleting_a_queue_needs_configure(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, lambda ch: ch.queue_delete("other-q"))
    assert (code, text) == (403, denied_text("queue", "other-q", vhost, user))


def test_dead_letter_and_alternate_exchanges_need_write_on_them(port, tenant):
    vhost, user = tenant
    code, text = refused(
        port,
        user,
        vhost,
        lambda ch: ch.queue_declare("bob-dl", arguments={"x-dead-letter-exchange": "other-x"}),
    )
    assert (code, text) == (403, denied_text("exchange", "other-x", vhost, user))
    code, text = refused(
        port,
        user,
        vhost,
        lambda ch: ch.exchange_declare(
            "bob-ae", "direct", arguments={"alternate-exchange": "other-x"}
        ),
    )
    assert (code, text) == (403, denied_text("exchange", "other-x", vhost, user))


# --- write and read ---------------------------------------------------------------


def _publish(exchange: str, key: str, **props):
    def action(ch):
        ch.confirm_delivery()
        ch.basic_publish(exchange, key, b"x", pika.BasicProperties(**props))

    return action


def test_publishing_needs_write_on_the_exchange(port, tenant):
    vhost, user = tenant
    code, text = refused(port, user, vhost, _publish("", "bob-q"))
    assert (code, text) == (403, denied_text("exchange", "amq.default", vhost, user))
    code, text = refused(port, user, vhost, _publish("amq.direct", "k"))
    assert (code, text) == (403, denied_text("exchange", "amq.direct", vhost, user))

    def own_exchange(ch):
        ch.exchange_declare("bob-x", "direct", auto_delete=True)
        ch.queue_declare("bob-q", auto_delete=True)
        ch.queue_bind("bob-q", "bob-x", "k")
        _publish("bob-x", "k")(ch)
        assert ch.basic_get("bob-q", auto_ack=True)[2] == b"x"

    allowed(port, user, vhost, own_exchange)


def test_binding_needs_read_on_the_source_and_write_on_the_destination(port, tenant):
    vhost, user = tenant

    def bind_from_amq_direct(ch):
        ch.queue_declare("bob-q2", auto_delete=True)
        ch.queue_bind("bob-q2", "amq.direct", "k")

    code, text = refused(port, user, vhost, bind_from_amq_direct)
    assert (code, text) == (403, denied_text("exchange", "amq.direct", vhost, user))

    def exchange_to_exchange(ch):
        ch.exchange_declare("bob-x2", "direct", auto_delete=True)
        ch.exchange_bind("bob-x2", "amq.fanout", "k")

    code, text = refused(port, user, vhost, exchange_to_exchange)
    assert (code, text) == (403, denied_text("exchange", "amq.fanout", vhost, user))


def test_consuming_getting_and_purging_need_read(port, operator, tenant):
    vhost, user = tenant
    admin = unique("admin")
    operator.add_user(admin, PASSWORD)
    operator.set_permissions(admin, vhost, ".*", ".*", ".*")
    allowed(port, admin, vhost, lambda ch: ch.queue_declare("other-q"))
    for action in (
        lambda ch: ch.basic_consume("other-q", lambda *a: None),
        lambda ch: ch.basic_get("other-q"),
        lambda ch: ch.queue_purge("other-q"),
    ):
        code, text = refused(port, user, vhost, action)
        assert (code, text) == (403, denied_text("queue", "other-q", vhost, user))


def test_user_id_must_be_the_logged_in_user_unless_impersonator(port, operator, tenant):
    vhost, user = tenant
    code, text = refused(
        port,
        user,
        vhost,
        lambda ch: (
            ch.exchange_declare("bob-u", "fanout", auto_delete=True),
            _publish("bob-u", "k", user_id="alice")(ch),
        ),
    )
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - user_id property set to 'alice' but authenticated user was '{user}'",
    )
    boss = unique("boss")
    operator.add_user(boss, PASSWORD, "impersonator")
    operator.set_permissions(boss, vhost, ".*", ".*", ".*")
    allowed(port, boss, vhost, _publish("amq.direct", "k", user_id="alice"))


# --- topic permissions ---------------------------------------------------------------


def test_topic_permissions_limit_routing_keys_on_their_exchange(port, operator, tenant):
    vhost, _user = tenant
    dan = unique("dan")
    operator.add_user(dan, PASSWORD)
    operator.set_permissions(dan, vhost, ".*", ".*", ".*")
    operator.set_topic_permissions(dan, vhost, "amq.topic", "^ok\\.", "^rd\\.")
    allowed(port, dan, vhost, _publish("amq.topic", "ok.a"))
    code, text = refused(port, dan, vhost, _publish("amq.topic", "bad.a"))
    assert (code, text) == (
        403,
        f"ACCESS_REFUSED - access to topic 'bad.a' in exchange 'amq.topic' in vhost '{vhost}' "
        f"refused for user '{dan}'",
    )

    def bind(key):
        def action(ch):
            ch.queue_declare("dan-q", auto_delete=True)
            ch.queue_bind("dan-q", "amq.topic", key)

        return action

    allowed(port, dan, vhost, bind("rd.x"))
    code, text = refused(port, dan, vhost, bind("bad.x"))
    assert (code, text) == (
        403,
        f"ACCESS_REFUSED - access to topic 'bad.x' in exchange 'amq.topic' in vhost '{vhost}' "
        f"refused for user '{dan}'",
    )
    # Another topic exchange has no topic permission for dan: anything goes.
    allowed(
        port,
        dan,
        vhost,
        lambda ch: (
            ch.exchange_declare("dan-t", "topic", auto_delete=True),
            _publish("dan-t", "bad.a")(ch),
        ),
    )


# --- limits ----------------------------------------------------------------------


def test_max_queues(port, operator, tenant):
    vhost, user = tenant
    operator.set_vhost_limit(vhost, "max-queues", 2)

    def declare_three(ch):
        for i in range(3):
            ch.queue_declare(f"bob-q{i}", auto_delete=True)

    conn = connect(port, user, vhost)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("bob-q0")
        ch.queue_declare("bob-q1")
        ch.queue_declare("bob-q2")
    assert (info.value.reply_code, info.value.reply_text) == (
        406,
        f"PRECONDITION_FAILED - cannot declare queue 'bob-q2': queue limit in vhost '{vhost}' (2) is reached",
    )
    ch = conn.channel()
    ch.queue_delete("bob-q0")
    ch.queue_delete("bob-q1")
    conn.close()


def test_max_connections(port, operator, tenant):
    vhost, user = tenant
    operator.set_vhost_limit(vhost, "max-connections", 1)
    first = connect(port, user, vhost)
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            connect(port, user, vhost)
        assert (
            f"(530) \"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': "
            'connection limit (1) is reached"'
        ) in str(info.value)
    finally:
        first.close()


# --- changes while connected ----------------------------------------------------------


def test_revoked_permissions_apply_from_the_next_operation(port, operator, tenant):
    vhost, user = tenant
    conn = connect(port, user, vhost)
    ch = conn.channel()
    ch.queue_declare("bob-r", auto_delete=True)
    operator.clear_permissions(user, vhost)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("bob-r2", auto_delete=True)
    assert info.value.reply_text == denied_text("queue", "bob-r2", vhost, user)
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(port, user, vhost)


def test_widened_permissions_apply_from_the_next_operation(port, operator, tenant):
    vhost, user = tenant
    conn = connect(port, user, vhost)
    ch = conn.channel()
    operator.set_permissions(user, vhost, ".*", ".*", ".*")
    ch.queue_declare("now-allowed", auto_delete=True)
    ch.confirm_delivery()
    ch.basic_publish("", "now-allowed", b"x")
    conn.close()


def _closed_reason(conn) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(50):
            conn.process_data_events(0.1)
    return info.value.reply_code, info.value.reply_text


def test_deleting_a_user_closes_its_connections(port, operator, tenant):
    vhost, user = tenant
    conn = connect(port, user, vhost)
    operator.delete_user(user)
    assert _closed_reason(conn) == (320, f"CONNECTION_FORCED - user '{user}' is deleted")


def test_deleting_a_vhost_closes_its_connections(port, operator, tenant):
    vhost, user = tenant
    conn = connect(port, user, vhost)
    operator.delete_vhost(vhost)
    expected = {f"CONNECTION_FORCED - vhost '{vhost}' is deleted"}
    if EXTERNAL_URL:  # RabbitMQ says "is down" when its vhost process stops first
        expected.add(f"CONNECTION_FORCED - vhost '{vhost}' is down")
    code, text = _closed_reason(conn)
    assert code == 320 and text in expected
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(port, user, vhost)
    assert f"NOT_ALLOWED - vhost {vhost} not found" in str(info.value)
