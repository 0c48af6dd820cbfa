"""Vhosts, users and permissions as the operator manages them (leveret.broker.admin),
and what survives a restart. Leveret's own model; the AMQP side is test_access.py."""

from __future__ import annotations

import base64
import hashlib
import sqlite3

import pika
import pytest

from leveret.auth import passwords
from leveret.auth.users import is_loopback
from leveret.broker.errors import AlreadyExists, InvalidValue, NotFound
from leveret.config import ServerConfig
from leveret.testing import embedded_broker

pytestmark = pytest.mark.leveret_only


def _connect(broker, user="guest", password="guest", vhost="/"):
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, password)
        )
    )


# --- passwords ------------------------------------------------------------------------


def _rabbit_hash(algorithm, password: str, salt: bytes = b"\x01\x02\x03\x04") -> str:
    return base64.b64encode(salt + algorithm(salt + password.encode()).digest()).decode()


@pytest.mark.parametrize(
    "name, function",
    [
        (passwords.SHA256, hashlib.sha256),
        (passwords.SHA512, hashlib.sha512),
        (passwords.MD5, hashlib.md5),
    ],
)
def test_rabbitmq_password_hashes_are_checked(name, function):
    stored = _rabbit_hash(function, "s3cret")
    assert passwords.check_password(stored, name, "s3cret")
    assert not passwords.check_password(stored, name, "s3cret!")


def test_a_known_rabbitmq_export_hash_logs_in():
    # guest/guest as RabbitMQ 3.10 exported it (GET /api/definitions).
    stored = "kjnepyXPQpB+7U3OjXc432p8s/DS2geaFZbarrppqGJNn2QG"
    assert passwords.check_password(stored, passwords.SHA256, "guest")
    assert not passwords.check_password(stored, passwords.SHA256, "Guest")


def test_new_hashes_are_salted_sha256():
    first, second = passwords.hash_password("pw"), passwords.hash_password("pw")
    assert first != second  # a fresh salt each time
    assert len(base64.b64decode(first)) == 4 + 32
    assert passwords.check_password(first, passwords.SHA256, "pw")


@pytest.mark.parametrize(
    "stored, algorithm, message",
    [
        ("not base64!!", passwords.SHA256, "is not valid base64"),
        (base64.b64encode(b"short").decode(), passwords.SHA256, "has 5 bytes"),
        ("AAAA", "rabbit_password_hashing_sha1", "unknown hashing_algorithm"),
    ],
)
def test_bad_hashes_are_refused_on_import(stored, algorithm, message):
    with pytest.raises(InvalidValue, match=message):
        passwords.validate_hash(stored, algorithm)


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("127.9.9.9") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback("::ffff:10.0.0.1")
    assert not is_loopback("?")


# --- operations and their refusals ----------------------------------------------------------


def test_operations_refuse_unknown_names_and_duplicates():
    with embedded_broker() as broker:
        admin = broker.admin
        with pytest.raises(NotFound, match="vhost 'nope' does not exist"):
            admin.delete_vhost("nope")
        with pytest.raises(NotFound, match="user 'nobody' does not exist"):
            admin.set_permissions("nobody", "/", ".*", ".*", ".*")
        with pytest.raises(NotFound, match="vhost 'nope' does not exist"):
            admin.set_permissions("guest", "nope", ".*", ".*", ".*")
        with pytest.raises(AlreadyExists, match="vhost '/' already exists"):
            admin.add_vhost("/")
        with pytest.raises(AlreadyExists, match="user 'guest' already exists"):
            admin.add_user("guest", "x")
        with pytest.raises(NotFound, match="user 'guest' has no permissions in vhost 'v'"):
            admin.add_vhost("v")
            admin.clear_permissions("guest", "v")
        with pytest.raises(InvalidValue, match="vhost name must be a non-empty string"):
            admin.add_vhost("")


def test_bad_regular_expressions_are_refused_when_set():
    with embedded_broker() as broker:
        admin = broker.admin
        with pytest.raises(InvalidValue, match=r"invalid regular expression '\(' for write"):
            admin.set_permissions("guest", "/", ".*", "(", ".*")
        with pytest.raises(InvalidValue, match="invalid regular expression '\\[a' for topic read"):
            admin.set_topic_permissions("guest", "/", "amq.topic", ".*", "[a")
        # The old permissions stand.
        assert admin.list_permissions(vhost="/")[0]["write"] == ".*"


def test_bad_vhost_limits_are_refused():
    with embedded_broker() as broker:
        admin = broker.admin
        with pytest.raises(InvalidValue, match="unknown vhost limit 'max-channels'"):
            admin.set_vhost_limits("/", {"max-channels": 3})
        with pytest.raises(InvalidValue, match="'max-queues' must be an integer"):
            admin.set_vhost_limits("/", {"max-queues": "3"})


def test_users_and_tags_are_listed_without_secrets():
    with embedded_broker() as broker:
        broker.admin.add_user("mon", "pw", "monitoring, management")
        assert broker.admin.list_users() == [
            {"name": "guest", "tags": ["administrator"]},
            {"name": "mon", "tags": ["monitoring", "management"]},
        ]


def test_a_user_without_a_password_cannot_log_in_with_plain():
    with embedded_broker(auth_failure_delay=0) as broker:
        broker.admin.add_user("certonly", None)
        broker.admin.set_permissions("certonly", "/", ".*", ".*", ".*")
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _connect(broker, "certonly", "")


def test_changed_password_applies_to_the_next_login():
    with embedded_broker(auth_failure_delay=0) as broker:
        broker.admin.change_password("guest", "new")
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _connect(broker)
        _connect(broker, password="new").close()


# --- durability -------------------------------------------------------------------------


def test_first_start_creates_guest_only_once(tmp_path):
    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        broker.admin.delete_user("guest")
        broker.admin.add_user("ops", "pw", ["administrator"])
        broker.admin.set_permissions("ops", "/", ".*", ".*", ".*")
    with embedded_broker(config) as broker:
        assert [u["name"] for u in broker.admin.list_users()] == ["ops"]
        _connect(broker, "ops", "pw").close()


def test_passwords_are_not_stored_in_plain_text(tmp_path):
    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        broker.admin.add_user("alice", "very-secret-password")
    raw = (tmp_path / "definitions.db").read_bytes()
    wal = tmp_path / "definitions.db-wal"
    if wal.exists():
        raw += wal.read_bytes()
    assert b"alice" in raw
    assert b"very-secret-password" not in raw


def test_messages_in_several_vhosts_survive_a_restart(tmp_path):
    """Vhosts are persisted before use; every vhost's messages come back."""
    config = ServerConfig(port=0, data_dir=str(tmp_path))
    vhosts = ["/", "team-a", "team-b", "with/slash"]
    with embedded_broker(config) as broker:
        for vhost in vhosts[1:]:
            broker.admin.add_vhost(vhost, description=f"{vhost} things")
            broker.admin.set_permissions("guest", vhost, ".*", ".*", ".*")
        broker.admin.set_vhost_limits("team-a", {"max-queues": 5})
        broker.admin.add_user("bob", "pw")
        broker.admin.set_permissions("bob", "team-b", "^bob-", "^bob-", "^bob-")
        broker.admin.set_topic_permissions("bob", "team-b", "amq.topic", "^a", "^b")
        for vhost in vhosts:
            conn = _connect(broker, vhost=vhost)
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("work", durable=True)
            for i in range(3):
                body = f"{vhost}:{i}".encode()
                ch.basic_publish("", "work", body, pika.BasicProperties(delivery_mode=2))
            conn.close()
    with embedded_broker(config) as broker:
        admin = broker.admin
        assert [v["name"] for v in admin.list_vhosts()] == sorted(vhosts)
        assert admin.list_vhosts()[1]["limits"] == {"max-queues": 5}
        assert admin.list_permissions(vhost="team-b") == [
            {
                "user": "bob",
                "vhost": "team-b",
                "configure": "^bob-",
                "write": "^bob-",
                "read": "^bob-",
            },
            {"user": "guest", "vhost": "team-b", "configure": ".*", "write": ".*", "read": ".*"},
        ]
        assert admin.list_topic_permissions(user="bob")[0]["write"] == "^a"
        for vhost in vhosts:
            conn = _connect(broker, vhost=vhost)
            ch = conn.channel()
            got = [ch.basic_get("work", auto_ack=True)[2] for _ in range(3)]
            assert got == [f"{vhost}:{i}".encode() for i in range(3)]
            conn.close()


def test_deleting_a_vhost_removes_its_durable_data(tmp_path):
    config = ServerConfig(port=0, data_dir=str(tmp_path))
    with embedded_broker(config) as broker:
        broker.admin.add_vhost("gone")
        broker.admin.set_permissions("guest", "gone", ".*", ".*", ".*")
        conn = _connect(broker, vhost="gone")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("gx", "direct", durable=True)
        ch.queue_declare("gq", durable=True)
        ch.queue_bind("gq", "gx", "k")
        ch.queue_declare("gs", durable=True, arguments={"x-queue-type": "stream"})
        ch.basic_publish("gx", "k", b"m", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "gs", b"s", pika.BasicProperties(delivery_mode=2))
        conn.close()
        assert (tmp_path / "streams" / "gone").exists()
        broker.admin.delete_vhost("gone")
        assert not (tmp_path / "streams" / "gone").exists()
        broker.admin.add_vhost("gone")  # a new vhost of the same name starts empty
        broker.admin.set_permissions("guest", "gone", ".*", ".*", ".*")
    db = sqlite3.connect(tmp_path / "definitions.db")
    for table in ("exchanges", "queues", "bindings"):
        assert db.execute(f"SELECT COUNT(*) FROM {table} WHERE vhost='gone'").fetchone() == (0,)
    db.close()
    with embedded_broker(config) as broker:
        conn = _connect(broker, vhost="gone")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("gq", passive=True)
        assert info.value.reply_code == 404
        conn.close()
