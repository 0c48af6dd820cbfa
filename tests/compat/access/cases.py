"""The access-control cases: what a client tries, under which users and permissions.

Each case runs in a fresh vhost `access` (driver.VHOST) where guest may do
everything and declares the `objects` first; `setup` makes users, permissions,
topic permissions and limits. Steps name the connection they use ("c1", "c2", ...)
so limits on connections can be tried. The answers come from the broker; nothing
here says what they should be.
"""

from __future__ import annotations

from typing import Any

from .driver import PASSWORD, VHOST

# --- the step vocabulary ------------------------------------------------------------------


def login(user: str = "alice", conn: str = "c1", **kw: Any) -> tuple:
    return ("login", conn, {"user": user, **kw})


def do(method: str, conn: str = "c1", **fields: Any) -> tuple:
    return ("method", conn, (method, fields))


def publish(exchange: str, routing_key: str, conn: str = "c1", **kw: Any) -> tuple:
    return ("publish", conn, {"exchange": exchange, "routing_key": routing_key, **kw})


def channel(conn: str = "c1") -> tuple:
    return ("channel", conn, None)


def close(conn: str = "c1") -> tuple:
    return ("close", conn, None)


def wait(conn: str = "c1") -> tuple:
    """Send nothing; the answer is what the broker sends next (a close, say)."""
    return ("wait", conn, None)


def http(method: str, path: str, user: str = "guest", **kw: Any) -> tuple:
    """A management API call (`body=` JSON, or `raw=` text)."""
    return ("http", user, {"method": method, "path": path, **kw})


def op(*action: Any) -> tuple:
    """An operator action between steps (driver's operators have the same names)."""
    return ("op", "", action)


def user(name: str, configure: str = ".*", write: str = ".*", read: str = ".*", tags: str = ""):
    """Setup: a user with these permissions in the case's vhost."""
    return [("user", name, PASSWORD, tags), ("perm", name, configure, write, read)]


SCOPED = user("alice", "^alice-", "^alice-", "^alice-")  # everything named alice-*
FULL = user("alice")


def exchange(name: str, kind: str = "direct", **kw: Any) -> tuple:
    return ("exchange.declare", {"exchange": name, "exchange_type": kind, **kw})


def queue(name: str, **kw: Any) -> tuple:
    return ("queue.declare", {"queue": name, **kw})


def bind(queue_name: str, exchange_name: str, key: str = "k") -> tuple:
    return ("queue.bind", {"queue": queue_name, "exchange": exchange_name, "routing_key": key})


#: what most cases need to exist: one pair alice may use, one she may not
OBJECTS = [
    exchange("alice-x"),
    exchange("other-x"),
    queue("alice-q"),
    queue("other-q"),
    bind("alice-q", "alice-x"),
    bind("other-q", "other-x"),
]

CASES: list[dict[str, Any]] = []


def case(name: str, about: str, setup: list, steps: list, objects: list | None = None) -> None:
    CASES.append(
        {
            "name": name,
            "about": about,
            "setup": [tuple(s) for s in setup],
            "objects": OBJECTS if objects is None else objects,
            "steps": steps,
        }
    )


# --- logging in ----------------------------------------------------------------------------

case("login-plain", "PLAIN with the right password", FULL, [login()])
case("login-plain-wrong-password", "PLAIN, wrong password", FULL, [login(password="nope")])
case("login-plain-unknown-user", "PLAIN, a user that does not exist", FULL, [login("nobody")])
case("login-amqplain", "AMQPLAIN with the right password", FULL, [login(mechanism="AMQPLAIN")])
case(
    "login-amqplain-wrong-password",
    "AMQPLAIN, wrong password",
    FULL,
    [login(mechanism="AMQPLAIN", password="nope")],
)
case(
    "login-wrong-password-no-capability",
    "a client that does not announce authentication_failure_close: no close method",
    FULL,
    [login(password="nope", capable=False)],
)
case(
    "login-unknown-user-no-capability",
    "unknown user, client without authentication_failure_close",
    FULL,
    [login("nobody", capable=False)],
)
case(
    "login-external-without-tls",
    "EXTERNAL is not offered on a plain TCP listener",
    FULL,
    [login(mechanism="EXTERNAL", response="")],
)
case(
    "login-unknown-mechanism",
    "a mechanism the broker does not have",
    FULL,
    [login(mechanism="CRAM-MD5", response="x")],
)
case(
    "login-plain-malformed-response",
    "a PLAIN response without its NUL separators",
    FULL,
    [login(response="alice" + PASSWORD)],
)
case(
    "login-user-without-password",
    "a user made without a password cannot log in with PLAIN, empty or not",
    [("user", "nopw", None, ""), ("perm", "nopw", ".*", ".*", ".*")],
    [login("nopw", password=""), login("nopw", password="anything")],
)
case(
    "login-guest-on-loopback",
    "guest may log in over loopback",
    [],
    [login("guest", password="guest")],
)

# --- opening a vhost -----------------------------------------------------------------------

case("vhost-missing", "a vhost that does not exist", FULL, [login(vhost="no-such-vhost")])
case(
    "vhost-no-permission",
    "a user with no permissions in the vhost",
    [("user", "alice", PASSWORD, "")],
    [login()],
)
case(
    "vhost-empty-permissions",
    "permissions that match nothing still open the vhost",
    user("alice", "", "", ""),
    [login(), do("queue.declare", queue="alice-q", passive=True)],
)

# --- configure ---------------------------------------------------------------------------

case(
    "queue-declare",
    "configure on the queue: allowed name, refused name",
    SCOPED,
    [login(), do("queue.declare", queue="alice-new"), do("queue.declare", queue="other-new")],
)
case(
    "queue-declare-passive",
    "a passive declare needs no permission",
    SCOPED,
    [login(), do("queue.declare", queue="other-q", passive=True)],
)
case(
    "queue-declare-server-named",
    "a server-named queue is checked under its generated name",
    SCOPED,
    [login(), do("queue.declare", queue="")],
)
case(
    "queue-declare-server-named-allowed",
    "a server-named queue with configure .*",
    FULL,
    [login(), do("queue.declare", queue="", exclusive=True)],
)
case(
    "queue-declare-reserved-name",
    "amq.* queue names are refused before permissions",
    FULL,
    [login(), do("queue.declare", queue="amq.mine")],
)
case(
    "queue-declare-empty-configure",
    "configure '' matches nothing",
    user("alice", "", ".*", ".*"),
    [login(), do("queue.declare", queue="alice-new")],
)
case(
    "queue-declare-dlx-write",
    "x-dead-letter-exchange needs write on the DLX",
    SCOPED,
    [
        login(),
        do("queue.declare", queue="alice-d", arguments={"x-dead-letter-exchange": "other-x"}),
        do("queue.declare", queue="alice-d", arguments={"x-dead-letter-exchange": "alice-x"}),
    ],
)
case(
    "queue-declare-dlx-read",
    "x-dead-letter-exchange also needs read on the queue",
    user("alice", "^alice-", "^alice-", "^nothing$"),
    [
        login(),
        do("queue.declare", queue="alice-d", arguments={"x-dead-letter-exchange": "alice-x"}),
    ],
)
case(
    "queue-declare-default-dlx",
    "the default exchange as DLX is checked as amq.default",
    SCOPED,
    [login(), do("queue.declare", queue="alice-d", arguments={"x-dead-letter-exchange": ""})],
)
case(
    "queue-delete",
    "configure on the queue",
    SCOPED,
    [login(), do("queue.delete", queue="other-q"), do("queue.delete", queue="alice-q")],
)
case(
    "exchange-declare",
    "configure on the exchange",
    SCOPED,
    [
        login(),
        do("exchange.declare", exchange="alice-new", exchange_type="fanout"),
        do("exchange.declare", exchange="other-new", exchange_type="fanout"),
    ],
)
case(
    "exchange-declare-passive",
    "a passive declare needs no permission",
    SCOPED,
    [login(), do("exchange.declare", exchange="other-x", passive=True)],
)
case(
    "exchange-declare-reserved-name",
    "amq.* exchange names are refused",
    FULL,
    [login(), do("exchange.declare", exchange="amq.mine", exchange_type="direct")],
)
case(
    "exchange-declare-reserved-name-passive",
    "a passive declare of a standard amq.* exchange",
    SCOPED,
    [login(), do("exchange.declare", exchange="amq.direct", passive=True)],
)
case(
    "exchange-declare-default",
    "declaring the default exchange",
    FULL,
    [login(), do("exchange.declare", exchange="", exchange_type="direct")],
)
case(
    "exchange-declare-alternate-write",
    "alternate-exchange needs write on the AE",
    SCOPED,
    [
        login(),
        do(
            "exchange.declare",
            exchange="alice-ae",
            exchange_type="fanout",
            arguments={"alternate-exchange": "other-x"},
        ),
        do(
            "exchange.declare",
            exchange="alice-ae",
            exchange_type="fanout",
            arguments={"alternate-exchange": "alice-x"},
        ),
    ],
)
case(
    "exchange-declare-alternate-read",
    "alternate-exchange also needs read on the exchange declared",
    user("alice", "^alice-", "^alice-", "^nothing$"),
    [
        login(),
        do(
            "exchange.declare",
            exchange="alice-ae",
            exchange_type="fanout",
            arguments={"alternate-exchange": "alice-x"},
        ),
    ],
)
case(
    "exchange-delete",
    "configure on the exchange",
    SCOPED,
    [login(), do("exchange.delete", exchange="other-x"), do("exchange.delete", exchange="alice-x")],
)
case(
    "exchange-delete-system",
    "a standard amq.* exchange cannot be deleted",
    FULL,
    [login(), do("exchange.delete", exchange="amq.direct")],
)
case(
    "exchange-delete-default",
    "the default exchange cannot be deleted",
    FULL,
    [login(), do("exchange.delete", exchange="")],
)

# --- bindings: write on the destination, read on the source --------------------------------

for method in ("queue.bind", "queue.unbind"):
    short = method.replace(".", "-")
    case(
        f"{short}",
        f"{method}: write on the queue and read on the exchange",
        SCOPED,
        [
            login(),
            do(method, queue="alice-q", exchange="alice-x", routing_key="k2"),
            do(method, queue="alice-q", exchange="other-x", routing_key="k2"),
            do(method, queue="other-q", exchange="alice-x", routing_key="k2"),
            do(method, queue="other-q", exchange="other-x", routing_key="k2"),
        ],
    )
    case(
        f"{short}-read-only",
        f"{method} with read but no write",
        user("alice", ".*", "^nothing$", ".*"),
        [login(), do(method, queue="alice-q", exchange="alice-x", routing_key="k")],
    )
    case(
        f"{short}-default-exchange",
        f"{method} on the default exchange",
        FULL,
        [login(), do(method, queue="alice-q", exchange="", routing_key="alice-q")],
    )
    case(
        f"{short}-amq-exchange",
        f"{method} to amq.direct needs read on amq.direct",
        SCOPED,
        [login(), do(method, queue="alice-q", exchange="amq.direct", routing_key="k")],
    )
    case(
        f"{short}-missing",
        f"{method}: a missing queue or exchange, with and without permission",
        SCOPED,
        [
            login(),
            do(method, queue="alice-none", exchange="alice-x", routing_key="k"),
            do(method, queue="alice-q", exchange="alice-none", routing_key="k"),
            do(method, queue="other-none", exchange="alice-x", routing_key="k"),
        ],
    )

for method in ("exchange.bind", "exchange.unbind"):
    short = method.replace(".", "-")
    case(
        short,
        f"{method}: write on the destination and read on the source",
        SCOPED,
        [
            login(),
            do("exchange.declare", exchange="alice-y", exchange_type="fanout"),
            do(method, destination="alice-y", source="alice-x", routing_key="k"),
            do(method, destination="alice-y", source="other-x", routing_key="k"),
            do(method, destination="other-x", source="alice-x", routing_key="k"),
            do(method, destination="other-x", source="other-x", routing_key="k"),
        ],
    )
    case(
        f"{short}-default-exchange",
        f"{method} with the default exchange on either side",
        FULL,
        [
            login(),
            do(method, destination="", source="alice-x", routing_key="k"),
            do(method, destination="alice-x", source="", routing_key="k"),
        ],
    )
    case(
        f"{short}-amq-exchange",
        f"{method} from and to amq.* exchanges",
        SCOPED,
        [
            login(),
            do(method, destination="alice-x", source="amq.fanout", routing_key="k"),
            do(method, destination="amq.fanout", source="alice-x", routing_key="k"),
        ],
    )

# --- write: publishing -----------------------------------------------------------------

case(
    "publish",
    "write on the exchange",
    SCOPED,
    [login(), publish("alice-x", "k"), publish("other-x", "k")],
)
case(
    "publish-default-exchange",
    "the default exchange is checked as amq.default",
    SCOPED,
    [login(), publish("", "alice-q")],
)
case(
    "publish-default-exchange-allowed",
    "write on amq.default allows the default exchange",
    user("alice", "^alice-", "^amq\\.default$", "^alice-"),
    [login(), publish("", "alice-q"), publish("alice-x", "k")],
)
case(
    "publish-amq-exchange",
    "amq.direct needs write like any other exchange",
    SCOPED,
    [login(), publish("amq.direct", "k")],
)
case(
    "publish-missing-exchange",
    "a missing exchange, with and without write",
    SCOPED,
    [login(), publish("alice-none", "k"), publish("other-none", "k")],
)
case(
    "publish-read-only-user",
    "a user with read only may not publish",
    user("alice", "", "", ".*"),
    [login(), publish("alice-x", "k"), do("basic.get", queue="alice-q")],
)

# --- read: consume, get, purge ---------------------------------------------------------

for method, extra in (
    ("basic.consume", {}),
    ("basic.get", {}),
    ("queue.purge", {}),
):
    short = method.replace(".", "-")
    case(
        short,
        f"{method} needs read on the queue",
        SCOPED,
        [login(), do(method, queue="alice-q", **extra), do(method, queue="other-q", **extra)],
    )
    case(
        f"{short}-missing",
        f"{method} on a missing queue, with and without read",
        SCOPED,
        [login(), do(method, queue="alice-none", **extra), do(method, queue="other-none", **extra)],
    )
case(
    "basic-consume-write-only",
    "write without read does not allow consuming",
    user("alice", ".*", ".*", ""),
    [login(), do("basic.consume", queue="alice-q")],
)
case(
    "basic-get-last-queue",
    "an empty queue name means the channel's last declared queue",
    SCOPED,
    [
        login(),
        do("queue.declare", queue="alice-q", passive=True),
        do("basic.get", queue=""),
        do("queue.declare", queue="other-q", passive=True),
        do("basic.get", queue=""),
    ],
)

# --- topic permissions ---------------------------------------------------------------------

TOPICS = [
    *FULL,
    ("topic", "alice", "alice-t", "^{username}\\.", "^{vhost}\\."),
]
TOPIC_OBJECTS = [*OBJECTS, exchange("alice-t", "topic"), exchange("alice-t2", "topic")]
case(
    "topic-write",
    "topic write on the routing key, with {username} expanded",
    TOPICS,
    [login(), publish("alice-t", "alice.x"), publish("alice-t", "bob.x")],
    TOPIC_OBJECTS,
)
case(
    "topic-read-bind",
    "topic read on the binding key, with {vhost} expanded",
    TOPICS,
    [
        login(),
        do("queue.bind", queue="alice-q", exchange="alice-t", routing_key=f"{VHOST}.x"),
        do("queue.bind", queue="alice-q", exchange="alice-t", routing_key="other.x"),
    ],
    TOPIC_OBJECTS,
)
case(
    "topic-read-unbind",
    "topic read also applies to queue.unbind",
    TOPICS,
    [login(), do("queue.unbind", queue="alice-q", exchange="alice-t", routing_key="other.x")],
    TOPIC_OBJECTS,
)
case(
    "topic-read-exchange-bind",
    "topic read on exchange.bind from a topic exchange",
    TOPICS,
    [
        login(),
        do("exchange.bind", destination="alice-x", source="alice-t", routing_key=f"{VHOST}.y"),
        do("exchange.bind", destination="alice-x", source="alice-t", routing_key="other.y"),
    ],
    TOPIC_OBJECTS,
)
case(
    "topic-other-exchange",
    "a topic exchange without a topic permission allows any key",
    TOPICS,
    [login(), publish("alice-t2", "bob.x")],
    TOPIC_OBJECTS,
)
case(
    "topic-on-direct-exchange",
    "topic permissions do not apply to a direct exchange",
    [*FULL, ("topic", "alice", "alice-x", "^nothing$", "^nothing$")],
    [login(), publish("alice-x", "k"), do("queue.bind", queue="alice-q", exchange="alice-x")],
)
case(
    "topic-amq-topic",
    "topic permissions on amq.topic",
    [*FULL, ("topic", "alice", "amq.topic", "^ok\\.", "^rd\\.")],
    [
        login(),
        publish("amq.topic", "ok.1"),
        publish("amq.topic", "no.1"),
        do("queue.bind", queue="alice-q", exchange="amq.topic", routing_key="rd.1"),
        do("queue.bind", queue="alice-q", exchange="amq.topic", routing_key="no.1"),
    ],
)
case(
    "topic-empty-write",
    "an empty topic write expression matches no key",
    [*FULL, ("topic", "alice", "alice-t", "", ".*")],
    [login(), publish("alice-t", "a")],
    TOPIC_OBJECTS,
)

# --- user_id -----------------------------------------------------------------------

case(
    "user-id",
    "user_id must be the logged-in user",
    FULL,
    [login(), publish("alice-x", "k", user_id="alice"), publish("alice-x", "k", user_id="bob")],
)
case(
    "user-id-impersonator",
    "an impersonator may set any user_id",
    user("alice", tags="impersonator"),
    [login(), publish("alice-x", "k", user_id="bob")],
)

# --- limits ------------------------------------------------------------------------

case(
    "vhost-max-connections",
    "the vhost's max-connections",
    [*FULL, ("vhost_limit", "max-connections", 1)],
    [login(conn="c1"), login(conn="c2"), close("c1"), login(conn="c3")],
)
case(
    "vhost-max-connections-zero",
    "max-connections 0 refuses every connection",
    [*FULL, ("vhost_limit", "max-connections", 0)],
    [login()],
)
case(
    "vhost-max-queues",
    "the vhost's max-queues counts the queues already there",
    [*FULL, ("vhost_limit", "max-queues", 3)],
    [
        login(),
        do("queue.declare", queue="alice-1"),
        do("queue.declare", queue="alice-2"),
        do("queue.declare", queue="alice-q"),
        do("queue.declare", queue="", exclusive=True),
    ],
)
case(
    "vhost-max-queues-zero",
    "max-queues 0 refuses every new queue",
    [*FULL, ("vhost_limit", "max-queues", 0)],
    [login(), do("queue.declare", queue="alice-1"), do("queue.declare", queue="alice-q")],
)
case(
    "user-max-connections",
    "the user's max-connections",
    [*FULL, ("user_limit", "alice", "max-connections", 1)],
    [login(conn="c1"), login(conn="c2"), close("c1"), login(conn="c3")],
)
case(
    "user-max-connections-zero",
    "user max-connections 0 refuses every connection",
    [*FULL, ("user_limit", "alice", "max-connections", 0)],
    [login()],
)
case(
    "user-max-channels",
    "the user's max-channels, over all of the user's connections",
    [*FULL, ("user_limit", "alice", "max-channels", 2)],
    [
        login(conn="c1"),
        channel("c1"),
        login(conn="c2"),
        channel("c2"),
        channel("c2"),
    ],
)
case(
    "user-max-channels-zero",
    "user max-channels 0 refuses every channel",
    [*FULL, ("user_limit", "alice", "max-channels", 0)],
    [login(), channel()],
)
case(
    "limits-before-permissions",
    "the vhost's limit is checked before the user's, both before permissions",
    [
        ("user", "alice", PASSWORD, ""),
        ("user_limit", "alice", "max-connections", 0),
        ("vhost_limit", "max-connections", 0),
    ],
    [login(), op("vhost_limit", "max-connections", -1), login()],
)
case(
    "user-limits-other-user",
    "a user's limits do not apply to another user",
    [
        *FULL,
        *user("bob"),
        ("user_limit", "alice", "max-connections", 1),
        ("user_limit", "alice", "max-channels", 1),
    ],
    [
        login(conn="c1"),
        login("bob", conn="c2"),
        login("bob", conn="c3"),
        channel("c2"),
        channel("c2"),
    ],
)

# --- changes while connected ---------------------------------------------------------

case(
    "revoked-new-resource",
    "permissions revoked while connected apply to a new resource",
    FULL,
    [
        login(),
        do("queue.declare", queue="alice-1"),
        op("clear_perm", "alice"),
        do("queue.declare", queue="alice-2"),
    ],
)
case(
    "revoked-same-resource",
    "permissions revoked while connected, the same resource again",
    FULL,
    [
        login(),
        do("queue.declare", queue="alice-1"),
        op("clear_perm", "alice"),
        do("queue.declare", queue="alice-1"),
    ],
)
case(
    "revoked-publish",
    "write revoked while connected, publishing to the same exchange again",
    FULL,
    [
        login(),
        publish("alice-x", "k"),
        op("perm", "alice", ".*", "^nothing$", ".*"),
        publish("alice-x", "k"),
    ],
)
case(
    "widened-while-connected",
    "permissions widened while connected apply at once",
    SCOPED,
    [login(), op("perm", "alice", ".*", ".*", ".*"), do("queue.declare", queue="other-new")],
)
case(
    "user-deleted-while-connected",
    "deleting a user closes its connections",
    FULL,
    [login(), op("delete_user", "alice"), wait()],
)
case(
    "vhost-deleted-while-connected",
    "deleting a vhost closes its connections",
    FULL,
    [login(), channel(), op("delete_vhost", VHOST), wait()],
)

# --- /api/user-limits -------------------------------------------------------------

LIMIT = "/api/user-limits/alice/max-channels"
case(
    "api-user-limits",
    "the management API's user limits: set, list, clear",
    [*FULL, ("user", "mon", PASSWORD, "monitoring")],
    [
        http("GET", "/api/user-limits"),
        http("PUT", "/api/user-limits/alice/max-connections", body={"value": 3}),
        http("PUT", LIMIT, body={"value": -1}),
        http("GET", "/api/user-limits"),
        http("GET", "/api/user-limits/alice"),
        http("GET", "/api/user-limits/guest"),
        http("GET", "/api/users/alice"),
        http("GET", "/api/user-limits/alice", user="mon"),
        http("DELETE", LIMIT),
        http("DELETE", LIMIT),
        http("DELETE", "/api/user-limits/alice/max-foo"),
        http("GET", "/api/user-limits/alice"),
        http("DELETE", "/api/user-limits/alice/max-connections"),
        http("GET", "/api/user-limits"),
    ],
    [],
)
case(
    "api-user-limits-errors",
    "the management API's user limits: bad bodies, unknown users and limits, missing tags",
    [*FULL, ("user", "mon", PASSWORD, "monitoring")],
    [
        http("PUT", LIMIT, body={"value": "x"}),
        http("PUT", LIMIT, body={"value": 1.5}),
        http("PUT", LIMIT, body={"value": "7"}),
        http("PUT", LIMIT, body={"value": True}),
        http("PUT", LIMIT, body={}),
        http("PUT", LIMIT, raw="not json"),
        http("PUT", "/api/user-limits/alice/max-foo", body={"value": 1}),
        http("PUT", "/api/user-limits/nobody/max-channels", body={"value": 1}),
        http("GET", "/api/user-limits/nobody"),
        http("DELETE", "/api/user-limits/nobody/max-channels"),
        http("PUT", LIMIT, user="mon", body={"value": 1}),
        http("DELETE", LIMIT, user="mon"),
        http("GET", "/api/user-limits", user="alice"),
        http("GET", "/api/user-limits/alice"),
    ],
    [],
)
