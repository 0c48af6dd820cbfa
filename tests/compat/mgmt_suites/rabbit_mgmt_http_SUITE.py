"""rabbit_mgmt_http_SUITE (deps/rabbitmq_management/test, RabbitMQ v3.10.8) as scenarios.

Each test of the suite becomes a `Scenario` of the same name doing the same requests in
the same order; what the Erlang test asserts is recorded from RabbitMQ 3.10.8 instead,
so the whole answer of every step is compared, not only what the test looked at.

Adaptations, the same on both brokers: objects are named `suite-*` (see scenario.py);
listings over the whole broker are made per vhost where the test counts items (a
shared reference broker has other vhosts); passwords are `suite-pw` unless the test
sets one. `NOT_TRANSLATED` names each test left out and why.
"""

from __future__ import annotations

from .scenario import NOBODY, Prev, Raw, Scenario, Step, amqp, wait

ALL = {"configure": ".*", "write": ".*", "read": ".*"}
PW = "suite-pw"


def get(path: str, user: str = "guest", **kw) -> Step:
    return Step("GET", "/api" + path, user=user, **kw)


def put(path: str, body=NOBODY, user: str = "guest", **kw) -> Step:
    return Step("PUT", "/api" + path, body, user=user, **kw)


def post(path: str, body=NOBODY, user: str = "guest", **kw) -> Step:
    return Step("POST", "/api" + path, body, user=user, **kw)


def delete(path: str, user: str = "guest", **kw) -> Step:
    return Step("DELETE", "/api" + path, user=user, **kw)


def user(name: str, tags: str = "management", **extra) -> Step:
    return put(f"/users/{name}", {"password": PW, "tags": tags, **extra})


def vhost(name: str) -> list[Step]:
    return [put(f"/vhosts/{name}"), put(f"/permissions/{name}/guest", ALL)]


def bye(*paths: str) -> list[Step]:
    return [Step("DELETE", "/api" + p) for p in paths]


NOT_TRANSLATED = {
    "cli_redirect_test": "the old /cli path of rabbitmqadmin's download: Leveret ships no download",
    "api_redirect_test": "a redirect of the UI's /api without a trailing slash, to a UI page",
    "stats_redirect_test": "redirects to a separate statistics node (a disabled_stats setting)",
    "ets_tables_memory_test": "Erlang ETS table sizes: nothing of the kind in Leveret",
    "memory_test": "the Erlang memory breakdown (its keys are Erlang's allocators)",
    "vhosts_test (crash part)": "force_vhost_failure is an Erlang RPC into the node",
    "user_credential_validation_*": "switches the credential validator by Erlang RPC",
    "multiple_invalid_connections_test": "spawns 100 Erlang processes sending garbage",
    "quorum_queues_test": "a loop checking Erlang metrics tables are cleaned up",
    "definitions_password_test (sha512 part)": "sets password_hashing_module by RPC",
    "long_definitions_multipart_test": "8 MB vhost names in a multipart upload",
    "oauth_test, disable_basic_auth_test, login_test": "set the plugin's environment by RPC",
    "rates_test, samples_range_test": "message rates over time: not comparable step by step",
}


SCENARIOS: list[Scenario] = [
    Scenario(
        "overview_test",
        [
            get("/overview", record="status"),
            user("suite-myuser"),
            get("/overview", "suite-myuser", record="status"),
            delete("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "cluster_name_test",
        [
            user("suite-myuser"),
            put("/cluster-name", {"name": "foo"}, "suite-myuser"),
            get("/cluster-name", "suite-myuser", volatile=("name",)),
            delete("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "nodes_test",
        [
            user("suite-user"),
            user("suite-monitor", "monitoring"),
            get("/nodes", record="status"),
            get("/nodes", "suite-monitor", record="status"),
            get("/nodes", "suite-user"),
            get("/nodes/{node}", record="status"),
            get("/nodes/{node}", "suite-monitor", record="status"),
            get("/nodes/{node}", "suite-user"),
            get("/nodes/nonode"),
            delete("/users/suite-user"),
            delete("/users/suite-monitor"),
        ],
        bye("/users/suite-user", "/users/suite-monitor"),
    ),
    Scenario(
        "auth_test",
        [
            user("suite-user", ""),
            Step("GET", "/api/overview", user="suite-user:wrong", record="status"),
            get("/overview", "suite-user"),
            get("/overview", "guest:gust"),
            get("/overview", record="status"),
            delete("/users/suite-user"),
        ],
        bye("/users/suite-user"),
    ),
    Scenario(
        "vhosts_test",
        [
            put("/vhosts/suite-myvhost"),
            put("/vhosts/suite-myvhost"),
            get("/vhosts/%2F", record="status"),
            get("/vhosts/suite-myvhost", volatile=("message_stats", "*_details")),
            delete("/vhosts/suite-myvhost"),
            get("/vhosts/suite-myvhost"),
            delete("/vhosts/suite-myvhost"),
        ],
        bye("/vhosts/suite-myvhost"),
    ),
    Scenario(
        "vhosts_description_test",
        [
            put(
                "/vhosts/suite-myvhost",
                {"description": "vhost description", "tags": "tag1,tag2"},
            ),
            get("/vhosts/suite-myvhost"),
            delete("/vhosts/suite-myvhost"),
        ],
        bye("/vhosts/suite-myvhost"),
    ),
    Scenario(
        "vhosts_trace_test",
        [
            put("/vhosts/suite-myvhost"),
            get("/vhosts/suite-myvhost"),
            put("/vhosts/suite-myvhost", {"tracing": True}),
            get("/vhosts/suite-myvhost"),
            put("/vhosts/suite-myvhost", {"tracing": True}),
            get("/vhosts/suite-myvhost"),
            put("/vhosts/suite-myvhost", {"tracing": False}),
            get("/vhosts/suite-myvhost"),
            delete("/vhosts/suite-myvhost"),
        ],
        bye("/vhosts/suite-myvhost"),
    ),
    Scenario(
        "users_test",
        [
            get("/whoami"),
            get("/users/suite-myuser"),
            put("/users/suite-myuser", Raw(b"Something not JSON")),
            put("/users/suite-myuser", {"flim": "flam"}),
            put("/users/suite-myuser", {"tags": ["management"], "password": "myuser"}),
            put("/users/suite-myuser", {"password_hash": "not_hash"}),
            put(
                "/users/suite-myuser",
                {"password_hash": "IECV6PZI/Invh0DL187KFpkO5Jc=", "tags": "management"},
            ),
            get("/users/suite-myuser"),
            put(
                "/users/suite-myuser",
                {
                    "password_hash": "IECV6PZI/Invh0DL187KFpkO5Jc=",
                    "hashing_algorithm": "rabbit_password_hashing_md5",
                    "tags": ["management"],
                },
            ),
            get("/users/suite-myuser"),
            put("/users/suite-myuser", {"password": "password", "tags": ["administrator", "foo"]}),
            get("/users/suite-myuser", volatile=("password_hash",)),
            get("/users", volatile=("password_hash",)),
            get("/overview", "suite-myuser:password", record="status"),
            put("/users/suite-myuser", {"password": "password", "tags": []}),
            get("/users/suite-myuser", volatile=("password_hash",)),
            delete("/users/suite-myuser"),
            get("/overview", "suite-myuser:password", record="status"),
            get("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "without_permissions_users_test",
        [
            put(
                "/users/suite-myuser",
                {"password_hash": "IECV6PZI/Invh0DL187KFpkO5Jc=", "tags": "management"},
            ),
            put("/permissions/%2F/suite-myuser", ALL),
            put(
                "/users/suite-myuserwithoutpermissions",
                {"password_hash": "IECV6PZI/Invh0DL187KFpkO5Jc=", "tags": "management"},
            ),
            get("/users/without-permissions"),
            delete("/users/suite-myuser"),
            delete("/users/suite-myuserwithoutpermissions"),
        ],
        bye("/users/suite-myuser", "/users/suite-myuserwithoutpermissions"),
    ),
    Scenario(
        "users_bulk_delete_test",
        [
            user("suite-myuser1"),
            user("suite-myuser2"),
            user("suite-myuser3"),
            get("/users/suite-myuser1", volatile=("password_hash",)),
            post("/users/bulk-delete", {"users": ["suite-myuser1", "suite-myuser2"]}),
            get("/users/suite-myuser1"),
            get("/users/suite-myuser2"),
            get("/users/suite-myuser3", volatile=("password_hash",)),
            post("/users/bulk-delete", {"users": ["suite-myuser3"]}),
            get("/users/suite-myuser3"),
        ],
        bye("/users/suite-myuser1", "/users/suite-myuser2", "/users/suite-myuser3"),
    ),
    Scenario(
        "users_legacy_administrator_test",
        [
            put("/users/suite-myuser1", {"administrator": "true", "password": "myuser1"}),
            put("/users/suite-myuser2", {"administrator": "false", "password": "myuser2"}),
            get("/users/suite-myuser1", volatile=("password_hash",)),
            get("/users/suite-myuser2", volatile=("password_hash",)),
            delete("/users/suite-myuser1"),
            delete("/users/suite-myuser2"),
        ],
        bye("/users/suite-myuser1", "/users/suite-myuser2"),
    ),
    Scenario(
        "adding_a_user_with_password_test",
        [
            put("/users/suite-user10", {"tags": "management", "password": "password"}),
            delete("/users/suite-user10"),
        ],
        bye("/users/suite-user10"),
    ),
    Scenario(
        "adding_a_user_with_password_hash_test",
        [
            put(
                "/users/suite-user11",
                {
                    "tags": "management",
                    "password_hash": "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b",
                },
            ),
            delete("/users/suite-user11"),
        ],
        bye("/users/suite-user11"),
    ),
    Scenario(
        "adding_a_user_with_permissions_in_single_operation_test",
        [
            put("/vhosts/suite-vhost42"),
            put("/vhosts/suite-vhost43"),
            put(
                "/users/suite-pp",
                {
                    "password": PW,
                    "tags": "management",
                    "permissions": {"suite-vhost42": ALL, "suite-vhost43": ALL},
                },
            ),
            get("/vhosts", "suite-pp", volatile=("message_stats", "*_details", "messages*")),
            put("/queues/suite-vhost42/suite-myqueue", {}, "suite-pp"),
            put("/queues/suite-vhost43/suite-myqueue", {}, "suite-pp"),
            *[get(p, "suite-pp", record="status") for p in ("/exchanges", "/queues", "/bindings")],
            *[
                get(f"{a}/{v}/{b}", "suite-pp", record="status")
                for a, b in (
                    ("/exchanges", ""),
                    ("/exchanges", "amq.direct"),
                    ("/queues", ""),
                    ("/queues", "suite-myqueue"),
                    ("/bindings", ""),
                    ("/queues", "suite-myqueue/bindings"),
                    ("/exchanges", "amq.default/bindings/source"),
                    ("/exchanges", "amq.default/bindings/destination"),
                    ("/bindings", "e/amq.default/q/suite-myqueue"),
                    ("/bindings", "e/amq.default/q/suite-myqueue/suite-myqueue"),
                )
                for v in ("suite-vhost42", "suite-vhost43")
            ],
            delete("/vhosts/suite-vhost42"),
            delete("/vhosts/suite-vhost43"),
            delete("/users/suite-pp"),
        ],
        bye("/vhosts/suite-vhost42", "/vhosts/suite-vhost43", "/users/suite-pp"),
    ),
    Scenario(
        "adding_a_user_without_tags_fails_test",
        [put("/users/suite-no-tags", {"password": "password"})],
        bye("/users/suite-no-tags"),
    ),
    Scenario(
        "adding_a_user_without_password_or_hash_test",
        [
            put("/users/suite-no-pwd", {"tags": "management"}),
            put("/users/suite-no-pwd", {"tags": "management"}),
            get("/users/suite-no-pwd"),
            get("/whoami", "suite-no-pwd:"),
            get("/whoami", "suite-no-pwd:anything"),
            delete("/users/suite-no-pwd"),
        ],
        bye("/users/suite-no-pwd"),
    ),
    Scenario(
        "adding_a_user_with_both_password_and_hash_fails_test",
        [
            put("/users/suite-myuser", {"password": "password", "password_hash": "password_hash"}),
            put(
                "/users/suite-myuser",
                {"tags": "management", "password": "password", "password_hash": "password_hash"},
            ),
            get("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "updating_a_user_without_password_or_hash_clears_password_test",
        [
            put("/users/suite-myuser", {"tags": "management", "password": "myuser"}),
            get("/whoami", "suite-myuser:myuser"),
            put("/users/suite-myuser", {"tags": "management"}),
            get("/users/suite-myuser"),
            get("/whoami", "suite-myuser:myuser"),
            delete("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "updating_tags_of_a_passwordless_user_test",
        [
            put("/users/suite-abc", {"tags": "management", "password": "myuser"}),
            put("/users/suite-abc", {"tags": "management"}),
            get("/users/suite-abc"),
            put("/users/suite-abc", {"tags": "impersonator"}),
            get("/users/suite-abc"),
            put("/users/suite-abc", {"tags": ""}),
            get("/users/suite-abc"),
            delete("/users/suite-abc"),
        ],
        bye("/users/suite-abc"),
    ),
    Scenario(
        "permissions_validation_test",
        [
            put("/permissions/suite-wrong/guest", ALL),
            put("/permissions/%2F/suite-wrong", ALL),
            put("/permissions/%2F/guest", {"configure": "[", "write": ".*", "read": ".*"}),
            put("/permissions/%2F/guest", ALL),
        ],
    ),
    Scenario(
        "permissions_list_test",
        [
            user("suite-myuser1", "administrator"),
            user("suite-myuser2", "administrator"),
            put("/vhosts/suite-myvhost1"),
            put("/vhosts/suite-myvhost2"),
            *[
                put(f"/permissions/{v}/{u}", {"configure": "foo", "write": "foo", "read": "foo"})
                for v, u in (
                    ("suite-myvhost1", "suite-myuser1"),
                    ("suite-myvhost2", "suite-myuser1"),
                    ("suite-myvhost1", "suite-myuser2"),
                )
            ],
            get("/permissions"),
            get("/users/suite-myuser1/permissions"),
            get("/users/suite-myuser2/permissions"),
            get("/vhosts/suite-myvhost1/permissions"),
            get("/users/suite-notmyuser/permissions"),
            get("/vhosts/suite-notmyvhost/permissions"),
            delete("/users/suite-myuser1"),
            delete("/users/suite-myuser2"),
            delete("/vhosts/suite-myvhost1"),
            delete("/vhosts/suite-myvhost2"),
        ],
        bye(
            "/users/suite-myuser1",
            "/users/suite-myuser2",
            "/vhosts/suite-myvhost1",
            "/vhosts/suite-myvhost2",
        ),
    ),
    Scenario(
        "permissions_test",
        [
            user("suite-myuser", "administrator"),
            put("/vhosts/suite-myvhost"),
            put(
                "/permissions/suite-myvhost/suite-myuser",
                {"configure": "foo", "write": "foo", "read": "foo"},
            ),
            get("/permissions/suite-myvhost/suite-myuser"),
            get("/permissions"),
            get("/users/suite-myuser/permissions"),
            delete("/permissions/suite-myvhost/suite-myuser"),
            get("/permissions/suite-myvhost/suite-myuser"),
            delete("/users/suite-myuser"),
            delete("/vhosts/suite-myvhost"),
        ],
        bye("/users/suite-myuser", "/vhosts/suite-myvhost"),
    ),
    Scenario(
        "topic_permissions_list_test",
        [
            user("suite-myuser1", "administrator"),
            user("suite-myuser2", "administrator"),
            put("/vhosts/suite-myvhost1"),
            put("/vhosts/suite-myvhost2"),
            *[
                put(
                    f"/topic-permissions/{v}/{u}",
                    {"exchange": "amq.topic", "write": "^a", "read": "^b"},
                )
                for v, u in (
                    ("suite-myvhost1", "suite-myuser1"),
                    ("suite-myvhost2", "suite-myuser1"),
                    ("suite-myvhost1", "suite-myuser2"),
                )
            ],
            put(
                "/topic-permissions/suite-myvhost1/suite-myuser1",
                {"exchange": "amq.direct", "write": "^a", "read": "^b"},
            ),
            get("/topic-permissions"),
            get("/users/suite-myuser1/topic-permissions"),
            get("/users/suite-myuser2/topic-permissions"),
            get("/vhosts/suite-myvhost1/topic-permissions"),
            get("/vhosts/suite-myvhost2/topic-permissions"),
            get("/users/suite-notmyuser/topic-permissions"),
            get("/vhosts/suite-notmyvhost/topic-permissions"),
            delete("/topic-permissions/suite-myvhost1/suite-myuser1/amq.direct"),
            get("/topic-permissions"),
            delete("/users/suite-myuser1"),
            delete("/users/suite-myuser2"),
            delete("/vhosts/suite-myvhost1"),
            delete("/vhosts/suite-myvhost2"),
        ],
        bye(
            "/users/suite-myuser1",
            "/users/suite-myuser2",
            "/vhosts/suite-myvhost1",
            "/vhosts/suite-myvhost2",
        ),
    ),
    Scenario(
        "topic_permissions_test",
        [
            user("suite-myuser1", "administrator"),
            user("suite-myuser2", "administrator"),
            put("/vhosts/suite-myvhost1"),
            put("/vhosts/suite-myvhost2"),
            *[
                put(
                    f"/topic-permissions/{v}/{u}",
                    {"exchange": "amq.topic", "write": "^a", "read": "^b"},
                )
                for v, u in (
                    ("suite-myvhost1", "suite-myuser1"),
                    ("suite-myvhost2", "suite-myuser1"),
                    ("suite-myvhost1", "suite-myuser2"),
                )
            ],
            get("/topic-permissions"),
            get("/topic-permissions/suite-myvhost1/suite-myuser1"),
            get("/topic-permissions/suite-myvhost2/suite-myuser1"),
            get("/topic-permissions/suite-myvhost1/suite-myuser2"),
            get("/topic-permissions/suite-myvhost1/suite-notmyuser"),
            get("/topic-permissions/suite-notmyvhost/suite-myuser2"),
            delete("/users/suite-myuser1"),
            delete("/users/suite-myuser2"),
            delete("/vhosts/suite-myvhost1"),
            delete("/vhosts/suite-myvhost2"),
        ],
        bye(
            "/users/suite-myuser1",
            "/users/suite-myuser2",
            "/vhosts/suite-myvhost1",
            "/vhosts/suite-myvhost2",
        ),
    ),
    Scenario(
        "connections_test",
        [
            amqp("open", label="a"),
            wait("/connections", count=1),
            get("/connections/{conn_a}", record="status"),
            delete("/connections/{conn_a}"),
            Step("SLEEP", "1"),
            get("/connections/{conn_a}"),
        ],
    ),
    Scenario(
        "exchanges_test",
        [
            get("/exchanges", record="status"),
            *vhost("suite-myvhost"),
            get("/exchanges/suite-myvhost/suite-foo"),
            put("/exchanges/suite-myvhost/suite-foo", {"type": "direct", "durable": "true"}),
            put("/exchanges/suite-myvhost/suite-foo", {"type": "direct", "durable": "true"}),
            get("/exchanges/%2F/suite-foo"),
            get("/exchanges/suite-myvhost/suite-foo"),
            put("/exchanges/suite-badvhost/suite-bar", {"type": "direct", "durable": "true"}),
            put("/exchanges/suite-myvhost/suite-bar", {"type": "bad_exchange_type"}),
            put("/exchanges/suite-myvhost/suite-bar", {"type": "direct", "durable": "troo"}),
            put("/exchanges/suite-myvhost/suite-foo", {"type": "direct"}),
            delete("/exchanges/suite-myvhost/suite-foo"),
            delete("/exchanges/suite-myvhost/suite-foo"),
            delete("/vhosts/suite-myvhost"),
            get("/exchanges/suite-badvhost"),
        ],
        bye("/vhosts/suite-myvhost"),
    ),
    Scenario(
        "queues_test",
        [
            *vhost("suite-v"),
            get("/queues/suite-v/suite-foo"),
            put("/queues/suite-v/suite-foo", {"durable": True}),
            put("/queues/suite-v/suite-foo", {"durable": True}),
            get("/queues/suite-v/suite-foo", record="status"),
            put("/queues/suite-badvhost/suite-bar", {"durable": True}),
            put("/queues/suite-v/suite-bar", {"durable": "troo"}),
            put("/queues/suite-v/suite-foo", {"durable": False}),
            put("/queues/suite-v/suite-baz", {"durable": True}),
            wait("/queues/suite-v", count=2),
            get(
                "/queues/suite-v",
                query={"columns": "name,vhost,durable,auto_delete,exclusive,arguments"},
            ),
            get(
                "/queues/suite-v/suite-foo",
                query={"columns": "name,vhost,durable,auto_delete,exclusive,arguments"},
            ),
            delete("/queues/suite-v/suite-foo"),
            delete("/queues/suite-v/suite-baz"),
            delete("/queues/suite-v/suite-foo"),
            get("/queues/suite-badvhost"),
            delete("/vhosts/suite-v"),
        ],
        bye("/vhosts/suite-v"),
    ),
]


def _msg(key: str, headers: dict, body: str, enc: str = "string") -> dict:
    return {
        "exchange": "",
        "routing_key": key,
        "properties": {"delivery_mode": 2, "headers": headers},
        "payload": body,
        "payload_encoding": enc,
    }


FWD = {"x-forwarding": [{"uri": "amqp://localhost/%2F/upstream"}]}
V = "suite-v"
Q = f"/queues/{V}"
X = f"/exchanges/{V}"
B = f"/bindings/{V}"
GET_ONE = {"ackmode": "ack_requeue_false", "count": 1, "encoding": "auto"}
#: a listing's statistics: how many messages moved, and when
STATS = ("message_stats", "*_details", "idle_since", "consumer_capacity")


def _pagination(kind: str) -> list[Step]:
    """exchanges_pagination_test / queue_pagination_test, per vhost (see the module)."""
    base = f"/{kind}/suite-vh1"
    return [
        *vhost("suite-vh1"),
        get(base, query={"page": "1", "page_size": "2"}, volatile=STATS),
        put(f"/{kind}/suite-vh1/suite-test0", {}),
        put(f"/{kind}/suite-vh1/suite-test1", {}),
        put(f"/{kind}/suite-vh1/suite-test2_reg", {}),
        put(f"/{kind}/suite-vh1/suite-reg_test3", {}),
        wait(base, count=4, has="messages") if kind == "queues" else wait(base, count=11),
        get(base, query={"page": "1", "page_size": "2"}, volatile=STATS, ordered=True),
        get(
            base,
            query={"sort": "name", "page": "1", "page_size": "2"},
            volatile=STATS,
            ordered=True,
        ),
        get(base, query={"page": "1"}, volatile=STATS),
        get(
            base,
            query={"page": "2", "page_size": "2", "sort": "name", "sort_reverse": "true"},
            volatile=STATS,
            ordered=True,
        ),
        get(base, query={"page": "1", "page_size": "2", "name": "reg"}, volatile=STATS),
        get(
            base,
            query={"page": "1", "page_size": "2", "name": "^(?=^suite-reg)", "use_regex": "true"},
            volatile=STATS,
        ),
        *[
            get(base, query=q)
            for q in (
                {"page": "1000"},
                {"page": "-1"},
                {"page": "not_an_integer_value"},
                {"page": "1", "page_size": "not_an_integer_value"},
                {"page": "1", "page_size": "501"},
                {"page": "-1", "page_size": "-2"},
            )
        ],
        delete("/vhosts/suite-vh1"),
    ]


SCENARIOS += [
    Scenario(
        "bindings_test",
        [
            *vhost(V),
            put(f"{X}/suite-myexchange", {"type": "direct"}),
            put(f"{Q}/suite-myqueue", {}),
            post(
                f"{B}/e/suite-myexchange/q/suite-myqueue",
                {"routing_key": "routing", "arguments": []},
            ),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/routing"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/rooting"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue"),
            get(f"{Q}/suite-myqueue/bindings"),
            get(f"{X}/suite-myexchange/bindings/source"),
            delete(f"{B}/e/suite-myexchange/q/suite-myqueue/routing"),
            delete(f"{B}/e/suite-myexchange/q/suite-myqueue/routing"),
            delete(f"{X}/suite-myexchange"),
            delete(f"{Q}/suite-myqueue"),
            get("/bindings/suite-badvhost"),
            get("/bindings/suite-badvhost/suite-myqueue/suite-myexchange/routing"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/routing"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "bindings_post_test",
        [
            *vhost(V),
            put(f"{X}/suite-myexchange", {"type": "direct"}),
            put(f"{Q}/suite-myqueue", {}),
            post(
                f"{B}/e/suite-myexchange/q/suite-badqueue",
                {"routing_key": "routing", "arguments": {"foo": "bar"}},
            ),
            post(
                f"{B}/e/suite-badexchange/q/suite-myqueue",
                {"routing_key": "routing", "arguments": {"foo": "bar"}},
            ),
            post(f"{B}/e/suite-myexchange/q/suite-myqueue", {}),
            post(
                f"{B}/e/suite-myexchange/q/suite-myqueue",
                {"routing_key": "routing", "arguments": {"foo": "bar"}},
            ),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/routing~oRoPN_tS9bbfKeTbyxuY5g"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/routing~oRoPN_tS9bbfKeTbyxuY5gx"),
            delete(f"{B}/e/suite-myexchange/q/suite-myqueue/routing~oRoPN_tS9bbfKeTbyxuY5g"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "bindings_null_routing_key_test",
        [
            *vhost(V),
            put(f"{X}/suite-myexchange", {"type": "direct"}),
            put(f"{Q}/suite-myqueue", {}),
            post(
                f"{B}/e/suite-myexchange/q/suite-badqueue", {"routing_key": None, "arguments": {}}
            ),
            post(
                f"{B}/e/suite-badexchange/q/suite-myqueue", {"routing_key": None, "arguments": {}}
            ),
            post(f"{B}/e/suite-myexchange/q/suite-myqueue", {}),
            post(f"{B}/e/suite-myexchange/q/suite-myqueue", {"routing_key": None, "arguments": {}}),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue"),
            get(f"{B}/e/suite-myexchange/q/suite-myqueue/null"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "bindings_e2e_test",
        [
            *vhost(V),
            post(
                f"{B}/e/amq.direct/e/suite-badexchange", {"routing_key": "routing", "arguments": []}
            ),
            post(
                f"{B}/e/suite-badexchange/e/amq.fanout", {"routing_key": "routing", "arguments": []}
            ),
            post(f"{B}/e/amq.direct/e/amq.fanout", {"routing_key": "routing", "arguments": []}),
            get(f"{B}/e/amq.direct/e/amq.fanout/routing"),
            delete(f"{B}/e/amq.direct/e/amq.fanout/routing"),
            post(f"{B}/e/amq.direct/e/amq.headers", {"routing_key": "routing", "arguments": []}),
            get(f"{B}/e/amq.direct/e/amq.headers/routing"),
            get(f"{B}/e/amq.direct/e/amq.headers"),
            get(f"{X}/amq.direct/bindings/source"),
            get(f"{X}/amq.headers/bindings/destination"),
            delete(f"{B}/e/amq.direct/e/amq.headers/routing"),
            get(f"{B}/e/amq.direct/e/amq.headers/rooting"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "permissions_administrator_test",
        [
            user("suite-isadmin", "administrator"),
            user("suite-notadmin", "administrator"),
            user("suite-notadmin", "management"),
            *[
                get(path, u, record="status")
                for path in (
                    "/vhosts/%2F",
                    "/vhosts/%2F/permissions",
                    "/users",
                    "/users/guest",
                    "/users/guest/permissions",
                    "/permissions",
                    "/permissions/%2F/guest",
                )
                for u in ("suite-notadmin", "suite-isadmin", "guest")
            ],
            get("/users/guest", "suite-notadmin"),
            delete("/users/suite-notadmin"),
            delete("/users/suite-isadmin"),
        ],
        bye("/users/suite-notadmin", "/users/suite-isadmin"),
    ),
    Scenario(
        "permissions_vhost_test",
        [
            user("suite-myadmin", "administrator"),
            user("suite-myuser"),
            put("/vhosts/suite-myvhost1"),
            put("/vhosts/suite-myvhost2"),
            put("/permissions/suite-myvhost1/suite-myuser", ALL),
            put("/permissions/suite-myvhost1/guest", ALL),
            put("/permissions/suite-myvhost2/guest", ALL),
            get("/vhosts", "suite-myuser", volatile=STATS + ("messages*", "recv_oct", "send_oct")),
            put("/queues/suite-myvhost1/suite-myqueue", {}),
            put("/queues/suite-myvhost2/suite-myqueue", {}),
            wait("/queues/suite-myvhost1", count=1, has="messages"),
            wait("/queues/suite-myvhost2", count=1, has="messages"),
            *[
                get(p, "suite-myuser", volatile=STATS)
                for p in ("/exchanges", "/queues", "/bindings")
            ],
            *[
                step
                for a, b in (
                    ("/exchanges", ""),
                    ("/exchanges", "amq.direct"),
                    ("/queues", ""),
                    ("/queues", "suite-myqueue"),
                    ("/bindings", ""),
                    ("/queues", "suite-myqueue/bindings"),
                    ("/exchanges", "amq.default/bindings/source"),
                    ("/exchanges", "amq.default/bindings/destination"),
                    ("/bindings", "e/amq.default/q/suite-myqueue"),
                    ("/bindings", "e/amq.default/q/suite-myqueue/suite-myqueue"),
                )
                for step in (
                    get(f"{a}/suite-myvhost1/{b}", "suite-myuser", record="status"),
                    get(f"{a}/suite-myvhost2/{b}", "suite-myuser"),
                )
            ],
            *[
                get(f"{p}/suite-myvhost1/", "suite-myadmin", record="status")
                for p in ("/exchanges", "/queues", "/bindings")
            ],
            delete("/vhosts/suite-myvhost1"),
            delete("/vhosts/suite-myvhost2"),
            delete("/users/suite-myuser"),
            delete("/users/suite-myadmin"),
        ],
        bye(
            "/vhosts/suite-myvhost1",
            "/vhosts/suite-myvhost2",
            "/users/suite-myuser",
            "/users/suite-myadmin",
        ),
    ),
    Scenario(
        "permissions_amqp_test",
        [
            *vhost(V),
            user("suite-myuser"),
            put(
                f"/permissions/{V}/suite-myuser",
                {"configure": "foo.*", "write": "foo.*", "read": "foo.*"},
            ),
            put(f"{Q}/bar-queue", {}, "suite-myuser"),
            put(f"{Q}/bar-queue", {}, "suite-nonexistent:nonexistent"),
            delete("/users/suite-myuser"),
            delete(f"/vhosts/{V}"),
        ],
        bye("/users/suite-myuser", f"/vhosts/{V}"),
    ),
    Scenario(
        "permissions_connection_channel_consumer_test",
        [
            *vhost(V),
            user("suite-user"),
            put(f"/permissions/{V}/suite-user", ALL),
            user("suite-monitor", "monitoring"),
            put(f"/permissions/{V}/suite-monitor", ALL),
            put(f"{Q}/suite-test", {}),
            amqp("open", label="user", user="suite-user", vhost=V),
            amqp("open", label="mon", user="suite-monitor", vhost=V),
            amqp("open", label="adm", user="guest", vhost=V),
            *[amqp("consume", label=c, queue="suite-test") for c in ("user", "mon", "adm")],
            wait(f"/vhosts/{V}/channels", count=3),
            wait(f"/consumers/{V}", count=3),
            *[
                get(p, u, record="status")
                for p in ("/connections", "/channels", "/consumers", f"/consumers/{V}")
                for u in ("suite-user", "suite-monitor", "guest")
            ],
            get(f"/vhosts/{V}/connections", "suite-user", volatile=STATS + ("channels",)),
            *[
                get(path.format(c=c), u, record="status")
                for path in (
                    "/connections/{{conn_{c}}}",
                    "/channels/{{conn_{c}}}%20(1)",
                    "/connections/{{conn_{c}}}/channels",
                )
                for c in ("user", "mon", "adm")
                for u in ("suite-user", "suite-monitor", "guest")
            ],
            delete("/connections/{conn_user}", "suite-monitor"),
            delete("/connections/{conn_mon}", "suite-user"),
            delete("/connections/{conn_adm}"),
            delete("/connections/{conn_mon}"),
            delete("/connections/{conn_user}", "suite-user"),
            delete("/users/suite-user"),
            delete("/users/suite-monitor"),
            get("/connections/foo"),
            get("/channels/foo"),
            delete(f"/vhosts/{V}"),
        ],
        bye("/users/suite-user", "/users/suite-monitor", f"/vhosts/{V}"),
    ),
    *[
        Scenario(
            f"consumers_{kind}_test",
            [
                *vhost(V),
                put(
                    f"{Q}/suite-test",
                    {"auto_delete": False, "durable": True, "arguments": {"x-queue-type": qtype}},
                ),
                amqp("open", label="c", vhost=V),
                amqp("consume", label="c", queue="suite-test", tag="my-ctag"),
                wait(f"/consumers/{V}", count=1),
                get(f"/consumers/{V}", volatile=("channel_details", "consumer_timeout")),
                amqp("close", label="c"),
                delete(f"{Q}/suite-test"),
                delete(f"/vhosts/{V}"),
            ],
            bye(f"/vhosts/{V}"),
        )
        for kind, qtype in (("cq", "classic"), ("qq", "quorum"))
    ],
    *[
        Scenario(
            f"single_active_consumer_{kind}_test",
            [
                *vhost(V),
                put(
                    f"{Q}/suite-sac-{kind}",
                    {
                        "auto_delete": False,
                        "durable": True,
                        "arguments": {"x-single-active-consumer": True, "x-queue-type": qtype},
                    },
                ),
                amqp("open", label="c", vhost=V),
                amqp("consume", label="c", queue=f"suite-sac-{kind}", tag="1", no_ack=True),
                amqp("channel", label="c", **{"as": "c2"}),
                amqp("consume", label="c2", queue=f"suite-sac-{kind}", tag="2", no_ack=True),
                wait(f"/consumers/{V}", count=2),
                get(f"/consumers/{V}", volatile=("channel_details", "consumer_timeout")),
                amqp("close_channel", label="c"),
                # RabbitMQ's statistics show the promotion a moment after the close
                wait(f"/consumers/{V}", count=1, activity_status="single_active"),
                get(f"/consumers/{V}", volatile=("channel_details", "consumer_timeout")),
                amqp("close", label="c"),
                delete(f"{Q}/suite-sac-{kind}"),
                delete(f"/vhosts/{V}"),
            ],
            bye(f"/vhosts/{V}"),
        )
        for kind, qtype in (("cq", "classic"), ("qq", "quorum"))
    ],
    Scenario(
        "definitions_vhost_test",
        [
            *vhost(V),
            *vhost("suite-test"),
            put(f"{Q}/suite-my-queue", {"durable": True}),
            put(f"{X}/suite-my-exchange", {"type": "direct"}),
            post(f"{B}/e/amq.direct/e/amq.fanout", {"routing_key": "routing", "arguments": {}}),
            put(
                f"/policies/{V}/suite-my-policy",
                {"pattern": ".*", "definition": {"max-length": 3}, "priority": 1},
            ),
            put(f"/parameters/vhost-limits/{V}/limits", {"value": {"max-connections": 100}}),
            get("/definitions/suite-test", volatile=("rabbit_version", "rabbitmq_version")),
            get(f"/definitions/{V}", volatile=("rabbit_version", "rabbitmq_version")),
            post("/definitions/suite-test", Prev(None)),
            get("/definitions/suite-test", volatile=("rabbit_version", "rabbitmq_version")),
            post(
                "/definitions/suite-othervhost",
                {"queues": [], "exchanges": [], "policies": [], "parameters": [], "bindings": []},
            ),
            delete(f"/vhosts/{V}"),
            delete("/vhosts/suite-test"),
        ],
        bye(f"/vhosts/{V}", "/vhosts/suite-test"),
    ),
    Scenario(
        "definitions_password_test",
        [
            post(
                "/definitions",
                {
                    "rabbit_version": "3.5.4",
                    "users": [
                        {
                            "name": "suite-myuser",
                            "password_hash": "WAbU0ZIcvjTpxM3Q3SbJhEAM2tQ=",
                            "tags": "management",
                        }
                    ],
                },
            ),
            get("/users/suite-myuser"),
            post(
                "/definitions",
                {
                    "rabbit_version": "3.6.0",
                    "users": [
                        {
                            "name": "suite-myuser",
                            "password_hash": "WAbU0ZIcvjTpxM3Q3SbJhEAM2tQ=",
                            "tags": "management",
                        }
                    ],
                },
            ),
            get("/users/suite-myuser"),
            delete("/users/suite-myuser"),
        ],
        bye("/users/suite-myuser"),
    ),
    Scenario(
        "definitions_remove_things_test",
        [
            *vhost(V),
            amqp("open", label="c", vhost=V),
            amqp("declare", label="c", queue="suite-my-exclusive", exclusive=True),
            get(f"{Q}/suite-my-exclusive", record="status"),
            get(f"/definitions/{V}", volatile=("rabbit_version", "rabbitmq_version")),
            amqp("close", label="c"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "definitions_with_charset_test",
        [
            *vhost(V),
            post(
                f"/definitions/{V}",
                {
                    "queues": [
                        {
                            "name": "suite-q",
                            "vhost": V,
                            "durable": True,
                            "auto_delete": False,
                            "arguments": {},
                        }
                    ]
                },
                headers={"Content-Type": "application/json; charset=utf-8"},
            ),
            get(f"{Q}/suite-q", query={"columns": "name,durable"}),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "aliveness_test",
        [
            *vhost(V),
            get(f"/aliveness-test/{V}"),
            get("/aliveness-test/suite-foo"),
            delete(f"{Q}/aliveness-test"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "arguments_test",
        [
            *vhost(V),
            put(
                f"{X}/suite-myexchange",
                {"type": "headers", "arguments": {"alternate-exchange": "amq.direct"}},
            ),
            put(f"{Q}/suite-arguments_test", {"arguments": {"x-expires": 1800000}}),
            post(
                f"{B}/e/suite-myexchange/q/suite-arguments_test",
                {"routing_key": "", "arguments": {"x-match": "all", "foo": "bar"}},
            ),
            get(f"/definitions/{V}", volatile=("rabbit_version", "rabbitmq_version")),
            delete(f"{X}/suite-myexchange"),
            delete(f"{Q}/suite-arguments_test"),
            post(
                f"/definitions/{V}",
                {
                    "queues": [
                        {
                            "name": "suite-arguments_test",
                            "durable": True,
                            "auto_delete": False,
                            "arguments": {"x-expires": 1800000},
                        }
                    ],
                    "exchanges": [
                        {
                            "name": "suite-myexchange",
                            "type": "headers",
                            "durable": True,
                            "auto_delete": False,
                            "internal": False,
                            "arguments": {"alternate-exchange": "amq.direct"},
                        }
                    ],
                    "bindings": [
                        {
                            "source": "suite-myexchange",
                            "destination": "suite-arguments_test",
                            "destination_type": "queue",
                            "routing_key": "",
                            "arguments": {"x-match": "all", "foo": "bar"},
                        }
                    ],
                },
            ),
            get(f"{X}/suite-myexchange", volatile=STATS),
            get(f"{Q}/suite-arguments_test", query={"columns": "name,arguments"}),
            get(f"{B}/e/suite-myexchange/q/suite-arguments_test"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "arguments_table_test",
        [
            *vhost(V),
            put(
                f"{X}/suite-myexchange",
                {
                    "type": "headers",
                    "arguments": {
                        "upstreams": [
                            "amqp://localhost/%2F/upstream1",
                            "amqp://localhost/%2F/upstream2",
                        ]
                    },
                },
            ),
            get(f"/definitions/{V}", volatile=("rabbit_version", "rabbitmq_version")),
            get(f"{X}/suite-myexchange", volatile=STATS),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "queue_purge_test",
        [
            *vhost(V),
            put(f"{Q}/suite-myqueue", {}),
            amqp("open", label="c", vhost=V),
            amqp("publish", label="c", routing_key="suite-myqueue", body="message"),
            amqp("publish", label="c", routing_key="suite-myqueue", body="message"),
            amqp("declare", label="c", queue="suite-exclusive", exclusive=True),
            delete(f"{Q}/suite-myqueue/contents"),
            delete(f"{Q}/suite-badqueue/contents"),
            delete(f"{Q}/suite-exclusive/contents"),
            delete(f"{Q}/suite-exclusive"),
            post(f"{Q}/suite-myqueue/get", GET_ONE),
            amqp("close", label="c"),
            delete(f"{Q}/suite-myqueue"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "queue_actions_test",
        [
            *vhost(V),
            put(f"{Q}/suite-q", {}),
            post(f"{Q}/suite-q/actions", {"action": "sync"}),
            post(f"{Q}/suite-q/actions", {"action": "cancel_sync"}),
            post(f"{Q}/suite-q/actions", {"action": "change_colour"}),
            delete(f"{Q}/suite-q"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "exclusive_queue_test",
        [
            *vhost(V),
            amqp("open", label="c", vhost=V),
            amqp("declare", label="c", queue="suite-excl", exclusive=True),
            amqp("consume", label="c", queue="suite-excl", exclusive=True),
            wait(Q, count=1, has="messages"),
            get(
                f"{Q}/suite-excl",
                query={"columns": "name,vhost,durable,auto_delete,exclusive,arguments"},
            ),
            get(Q, record="status"),
            amqp("close", label="c"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "connections_channels_pagination_test",
        [
            *vhost(V),
            amqp("open", label="a", vhost=V),
            amqp("open", label="b", vhost=V),
            amqp("open", label="c", vhost=V),
            wait(f"/vhosts/{V}/channels", count=3),
            get(f"/vhosts/{V}/connections", query={"page": "1", "page_size": "2"}, record="status"),
            get(f"/vhosts/{V}/channels", query={"page": "2", "page_size": "2"}, record="status"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario("exchanges_pagination_test", _pagination("exchanges"), bye("/vhosts/suite-vh1")),
    Scenario("queue_pagination_test", _pagination("queues"), bye("/vhosts/suite-vh1")),
    Scenario(
        "queue_pagination_columns_test",
        [
            *vhost("suite-vh1"),
            get("/queues/suite-vh1", query={"columns": "name", "page": "1", "page_size": "2"}),
            *[put(f"/queues/suite-vh1/suite-queue_{c}", {}) for c in "abcd"],
            wait("/queues/suite-vh1", count=4),
            get(
                "/queues/suite-vh1",
                query={"columns": "name", "page": "1", "page_size": "2"},
                ordered=True,
            ),
            get(
                "/queues/suite-vh1",
                query={"columns": "name,vhost", "page": "2", "page_size": "2"},
                ordered=True,
            ),
            delete("/vhosts/suite-vh1"),
        ],
        bye("/vhosts/suite-vh1"),
    ),
    Scenario(
        "queues_pagination_permissions_test",
        [
            user("suite-non-admin"),
            user("suite-admin", "administrator"),
            *vhost("suite-vh1"),
            *vhost("suite-vh2"),
            put("/permissions/suite-vh1/suite-non-admin", ALL),
            put("/permissions/suite-vh2/suite-admin", ALL),
            put("/permissions/suite-vh1/suite-admin", ALL),
            put("/queues/suite-vh2/suite-test0", {}),
            put("/queues/suite-vh1/suite-test1", {}, "suite-non-admin"),
            wait("/queues/suite-vh1", count=1, has="messages"),
            wait("/queues/suite-vh2", count=1, has="messages"),
            get("/queues", "suite-non-admin", query={"page": "1"}, volatile=STATS),
            delete("/queues/suite-vh1/suite-test1", "suite-admin"),
            delete("/users/suite-admin"),
            delete("/users/suite-non-admin"),
            delete("/vhosts/suite-vh1"),
            delete("/vhosts/suite-vh2"),
        ],
        bye(
            "/users/suite-admin", "/users/suite-non-admin", "/vhosts/suite-vh1", "/vhosts/suite-vh2"
        ),
    ),
    Scenario(
        "sorting_test",
        [
            *vhost("suite-vh19"),
            *vhost("suite-vh20"),
            put("/queues/suite-vh20/suite-test0", {}),
            put("/queues/suite-vh19/suite-test1", {}),
            put("/queues/suite-vh20/suite-test2", {}),
            put("/queues/suite-vh19/suite-test3", {}),
            wait("/queues/suite-vh19", count=2),
            wait("/queues/suite-vh20", count=2),
            *[
                get("/queues", query={"columns": "name,vhost", **q}, ordered=True)
                for q in (
                    {"sort": "name"},
                    {"sort": "vhost"},
                    {"sort": "name", "sort_reverse": "true"},
                    {"sort": "vhost", "sort_reverse": "true"},
                )
            ],
            get("/queues", query={"sort": "owner_pid_details.name"}, record="status"),
            delete("/vhosts/suite-vh19"),
            delete("/vhosts/suite-vh20"),
        ],
        bye("/vhosts/suite-vh19", "/vhosts/suite-vh20"),
    ),
    Scenario(
        "format_output_test",
        [
            *vhost(V),
            put(f"{Q}/suite-test0", {}),
            wait(Q, count=1, has="messages"),
            get(
                Q,
                query={
                    "columns": "name,consumer_capacity,consumer_utilisation,"
                    "exclusive_consumer_tag,recoverable_slaves"
                },
            ),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "columns_test",
        [
            *vhost(V),
            put(f"{Q}/suite-columns.test", {"arguments": {"x-message-ttl": 30000}}),
            wait(Q, count=1, has="messages"),
            get(Q, query={"columns": "arguments.x-message-ttl,name"}),
            get(f"{Q}/suite-columns.test", query={"columns": "arguments.x-message-ttl,name"}),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "get_test",
        [
            *vhost(V),
            put(f"{Q}/suite-myqueue", {}),
            *[
                post(f"/exchanges/{V}/amq.default/publish", _msg("suite-myqueue", FWD, f"{i}aaa"))
                for i in (1, 2, 3)
            ],
            post(f"{Q}/suite-myqueue/get", {**GET_ONE, "truncate": 1}),
            post(
                f"{Q}/suite-myqueue/get",
                {"ackmode": "ack_requeue_true", "count": 5, "encoding": "auto"},
            ),
            post(
                f"{Q}/suite-myqueue/get",
                {"ackmode": "ack_requeue_false", "count": 5, "encoding": "auto"},
            ),
            *[
                post(f"/exchanges/{V}/amq.default/publish", _msg("suite-myqueue", FWD, f"{i}aaa"))
                for i in (4, 5)
            ],
            post(
                f"{Q}/suite-myqueue/get",
                {"ackmode": "reject_requeue_true", "count": 5, "encoding": "auto"},
            ),
            post(
                f"{Q}/suite-myqueue/get",
                {"ackmode": "ack_requeue_false", "count": 5, "encoding": "auto"},
            ),
            post(
                f"{Q}/suite-myqueue/get",
                {"ackmode": "ack_requeue_false", "count": 5, "encoding": "auto"},
            ),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "get_encoding_test",
        [
            *vhost(V),
            put(f"{Q}/suite-get_encoding_test", {}),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-get_encoding_test", {}, "TG/Dr2Mgd2FzIGhlcmUh", "base64"),
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-get_encoding_test", {}, "AAAAAAAAAAD//QAAAAAAAAAA", "base64"),
            ),
            post(
                f"{Q}/suite-get_encoding_test/get",
                {"ackmode": "ack_requeue_false", "count": 2, "encoding": "auto"},
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-get_encoding_test", {}, "TG/Dr2Mgd2FzIGhlcmUh", "base64"),
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-get_encoding_test", {}, "AAAAAAAAAAD//QAAAAAAAAAA", "base64"),
            ),
            post(
                f"{Q}/suite-get_encoding_test/get",
                {"ackmode": "ack_requeue_false", "count": 2, "encoding": "base64"},
            ),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "get_fail_test",
        [
            *vhost(V),
            user("suite-myuser"),
            put(f"{Q}/suite-myqueue", {}),
            post(f"{Q}/suite-myqueue/get", GET_ONE, "suite-myuser"),
            delete(f"/vhosts/{V}"),
            delete("/users/suite-myuser"),
        ],
        bye(f"/vhosts/{V}", "/users/suite-myuser"),
    ),
    *[
        Scenario(
            name,
            [
                *vhost(V),
                put(f"{Q}/suite-publish_test", {}),
                post(
                    f"/exchanges/{V}/amq.default/publish",
                    _msg("suite-publish_test", FWD, "Hello world"),
                    headers=headers,
                ),
                post(f"{Q}/suite-publish_test/get", GET_ONE, headers=headers),
                post(f"/exchanges/{V}/amq.default/publish", Prev(0), headers=headers),
                post(f"{Q}/suite-publish_test/get", GET_ONE, headers=headers),
                delete(f"/vhosts/{V}"),
            ],
            bye(f"/vhosts/{V}"),
        )
        for name, headers in (
            ("publish_test", {}),
            ("publish_accept_json_test", {"Accept": "application/json"}),
        )
    ],
    Scenario(
        "publish_fail_test",
        [
            *vhost(V),
            put(f"{Q}/suite-publish_fail_test", {}),
            user("suite-myuser"),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-publish_fail_test", {}, "Hello world"),
                "suite-myuser",
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                {
                    "exchange": "",
                    "routing_key": "suite-publish_fail_test",
                    "properties": {"user_id": "foo"},
                    "payload": "Hello world",
                    "payload_encoding": "string",
                },
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                {
                    "exchange": "",
                    "routing_key": "suite-publish_fail_test",
                    "properties": {},
                    "payload": ["not a string"],
                    "payload_encoding": "string",
                },
            ),
            *[
                post(
                    f"/exchanges/{V}/amq.default/publish",
                    {
                        "exchange": "",
                        "routing_key": "suite-publish_fail_test",
                        "payload": "Hello world",
                        "payload_encoding": "string",
                        "properties": bad,
                    },
                )
                for bad in (
                    {"priority": "really high"},
                    {"timestamp": "recently"},
                    {"expiration": 1234},
                )
            ],
            delete(f"/vhosts/{V}"),
            delete("/users/suite-myuser"),
        ],
        bye(f"/vhosts/{V}", "/users/suite-myuser"),
    ),
    Scenario(
        "publish_base64_test",
        [
            *vhost(V),
            put(f"{Q}/suite-publish_base64_test", {}),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-publish_base64_test", {}, "YWJjZA==", "base64"),
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-publish_base64_test", {}, "flibble", "base64"),
            ),
            post(
                f"/exchanges/{V}/amq.default/publish",
                _msg("suite-publish_base64_test", {}, "YWJjZA==", "base99"),
            ),
            post(f"{Q}/suite-publish_base64_test/get", GET_ONE),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "publish_unrouted_test",
        [
            *vhost(V),
            post(f"/exchanges/{V}/amq.default/publish", _msg("hmmm", {}, "Hello world")),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "if_empty_unused_test",
        [
            *vhost(V),
            put(f"{X}/suite-test", {}),
            put(f"{Q}/suite-test", {}),
            post(f"{B}/e/suite-test/q/suite-test", {}),
            post(f"/exchanges/{V}/amq.default/publish", _msg("suite-test", {}, "Hello world")),
            delete(f"{Q}/suite-test", query={"if-empty": "true"}),
            delete(f"{X}/suite-test", query={"if-unused": "true"}),
            delete(f"{Q}/suite-test/contents"),
            amqp("open", label="c", vhost=V),
            amqp("consume", label="c", queue="suite-test"),
            delete(f"{Q}/suite-test", query={"if-unused": "true"}),
            amqp("close", label="c"),
            delete(f"{Q}/suite-test", query={"if-empty": "true"}),
            delete(f"{X}/suite-test", query={"if-unused": "true"}),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "global_parameters_test",
        [
            put("/global-parameters/suite-good", {"value": {"a": "b"}}),
            put("/global-parameters/suite-maybe", {"value": {"c": "d"}}),
            get("/global-parameters", volatile=("value",)),
            get("/global-parameters/suite-oops"),
            get("/global-parameters/suite-good"),
            get("/global-parameters/suite-maybe"),
            delete("/global-parameters/suite-good"),
            delete("/global-parameters/suite-maybe"),
            delete("/global-parameters/suite-bad"),
        ],
        bye("/global-parameters/suite-good", "/global-parameters/suite-maybe"),
    ),
    Scenario(
        "policy_test",
        [
            *vhost(V),
            put(
                f"/policies/{V}/suite-policy_pos",
                {"pattern": ".*", "definition": {"max-length": 3}, "priority": 10},
            ),
            put(
                f"/policies/{V}/suite-policy_even",
                {"pattern": ".*", "definition": {"max-length-bytes": 4}, "priority": 10},
            ),
            get(f"/policies/{V}/suite-policy_pos"),
            get(f"/policies/{V}/suite-policy_even"),
            get(f"/policies/{V}"),
            delete(f"/policies/{V}/suite-policy_pos"),
            delete(f"/policies/{V}/suite-policy_even"),
            get(f"/policies/{V}"),
            delete(f"/vhosts/{V}"),
        ],
        bye(f"/vhosts/{V}"),
    ),
    Scenario(
        "policy_permissions_test",
        [
            user("suite-admin", "administrator"),
            user("suite-mon", "monitoring"),
            user("suite-policy", "policymaker"),
            user("suite-mgmt", "management"),
            *vhost("suite-v"),
            *vhost("suite-other"),
            *[
                put(f"/permissions/suite-v/suite-{u}", ALL)
                for u in ("admin", "mon", "policy", "mgmt")
            ],
            put(
                "/policies/suite-other/suite-HA", {"pattern": ".*", "definition": {"max-length": 1}}
            ),
            *[
                step
                for u in ("suite-mon", "suite-mgmt")
                for step in (
                    put(
                        "/policies/suite-v/suite-HA",
                        {"pattern": ".*", "definition": {"max-length": 1}},
                        u,
                    ),
                    put(
                        "/parameters/federation-upstream/suite-v/suite-good",
                        {"value": {"uri": "amqp://"}},
                        u,
                    ),
                    get("/policies", u),
                    get("/policies/suite-v", u),
                    get("/parameters", u),
                    get("/parameters/federation-upstream", u),
                    get("/parameters/federation-upstream/suite-v", u),
                    get("/policies/suite-v/suite-HA", u),
                    get("/parameters/federation-upstream/suite-v/suite-good", u),
                )
            ],
            *[
                step
                for u in ("suite-admin", "suite-policy")
                for step in (
                    put(
                        "/policies/suite-v/suite-HA",
                        {"pattern": ".*", "definition": {"max-length": 1}},
                        u,
                    ),
                    put(
                        "/parameters/federation-upstream/suite-v/suite-good",
                        {"value": {"uri": "amqp://"}},
                        u,
                    ),
                    get("/policies/suite-v", u),
                    get("/parameters/federation-upstream/suite-v", u),
                    get("/policies/suite-v/suite-HA", u),
                    get("/parameters/federation-upstream/suite-v/suite-good", u),
                )
            ],
            *[
                step
                for u in ("suite-mon", "suite-mgmt", "suite-policy")
                for step in (
                    put(
                        "/policies/suite-other/suite-HA",
                        {"pattern": ".*", "definition": {"max-length": 1}},
                        u,
                    ),
                    get("/policies/suite-other/suite-HA", u),
                )
            ],
            put(
                "/policies/suite-other/suite-HA",
                {"pattern": ".*", "definition": {"max-length": 1}},
                "suite-admin",
            ),
            get("/policies/suite-other/suite-HA", "suite-admin"),
            delete("/vhosts/suite-v"),
            delete("/vhosts/suite-other"),
            *[delete(f"/users/suite-{u}") for u in ("admin", "mon", "policy", "mgmt")],
        ],
        bye(
            "/vhosts/suite-v",
            "/vhosts/suite-other",
            *[f"/users/suite-{u}" for u in ("admin", "mon", "policy", "mgmt")],
        ),
    ),
    Scenario(
        "issue67_test",
        [get("/queues", "suite-user_no_access:password_no_access")],
    ),
    Scenario("extensions_test", [get("/extensions", record="status")]),
    Scenario(
        "vhost_limits_list_test",
        [
            get("/vhost-limits/suite-limit_test_vhost_1"),
            put("/vhosts/suite-limit_test_vhost_1"),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            get("/vhost-limits/suite-limit_test_vhost_2"),
            put("/vhosts/suite-limit_test_vhost_2"),
            get("/vhost-limits/suite-limit_test_vhost_2"),
            put("/vhost-limits/suite-limit_test_vhost_1/max-connections", {"value": 100}),
            put("/vhost-limits/suite-limit_test_vhost_1/max-queues", {"value": 100}),
            put("/vhost-limits/suite-limit_test_vhost_2/max-connections", {"value": 200}),
            get("/vhost-limits"),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            get("/vhost-limits/suite-limit_test_vhost_2"),
            user("suite-no_vhost_user"),
            get("/vhost-limits", "suite-no_vhost_user"),
            get("/vhost-limits/suite-limit_test_vhost_1", "suite-no_vhost_user"),
            user("suite-v1_user"),
            put("/permissions/suite-limit_test_vhost_1/suite-v1_user", ALL),
            get("/vhost-limits", "suite-v1_user"),
            get("/vhost-limits/suite-limit_test_vhost_1", "suite-v1_user"),
            get("/vhost-limits/suite-limit_test_vhost_2", "suite-v1_user"),
            delete("/vhosts/suite-limit_test_vhost_1"),
            delete("/vhosts/suite-limit_test_vhost_2"),
            delete("/users/suite-no_vhost_user"),
            delete("/users/suite-v1_user"),
        ],
        bye(
            "/vhosts/suite-limit_test_vhost_1",
            "/vhosts/suite-limit_test_vhost_2",
            "/users/suite-no_vhost_user",
            "/users/suite-v1_user",
        ),
    ),
    Scenario(
        "vhost_limit_set_test",
        [
            put("/vhosts/suite-limit_test_vhost_1"),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            put("/vhost-limits/suite-limit_test_vhost_1/max-queues", {"value": 100}),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            put("/vhost-limits/suite-limit_test_vhost_1/max-connections", {"value": 200}),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            put("/vhost-limits/suite-limit_test_vhost_1/max-connections", {"value": 1000}),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            user("suite-v1_user"),
            put("/permissions/suite-limit_test_vhost_1/suite-v1_user", ALL),
            get("/vhost-limits/suite-limit_test_vhost_1", "suite-v1_user"),
            put(
                "/vhost-limits/suite-limit_test_vhost_1/max-connections",
                {"value": 300},
                "suite-v1_user",
            ),
            delete("/vhost-limits/suite-limit_test_vhost_1/max-connections"),
            get("/vhost-limits/suite-limit_test_vhost_1"),
            delete("/vhost-limits/suite-limit_test_vhost_1/max-queues", "suite-v1_user"),
            put("/vhost-limits/suite-limit_test_vhost_1/max-channels", {"value": 200}),
            delete("/vhosts/suite-limit_test_vhost_1"),
            delete("/users/suite-v1_user"),
        ],
        bye("/vhosts/suite-limit_test_vhost_1", "/users/suite-v1_user"),
    ),
    Scenario(
        "user_limits_list_test",
        [
            get("/user-limits/suite-limit_test_user_1"),
            put("/vhosts/suite-limit_test_vhost_1"),
            user("suite-limit_test_user_1"),
            put("/permissions/suite-limit_test_vhost_1/suite-limit_test_user_1", ALL),
            get("/user-limits/suite-limit_test_user_1"),
            user("suite-limit_test_user_2"),
            get("/user-limits/suite-limit_test_user_2"),
            put("/user-limits/suite-limit_test_user_1/max-connections", {"value": 100}),
            put("/user-limits/suite-limit_test_user_1/max-channels", {"value": 100}),
            put("/user-limits/suite-limit_test_user_2/max-connections", {"value": 200}),
            get("/user-limits"),
            get("/user-limits/suite-limit_test_user_1"),
            delete("/user-limits/suite-limit_test_user_1/max-connections"),
            get("/user-limits/suite-limit_test_user_1"),
            delete("/user-limits/suite-limit_test_user_1/max-channels"),
            get("/user-limits/suite-limit_test_user_1"),
            delete("/vhosts/suite-limit_test_vhost_1"),
            delete("/users/suite-limit_test_user_1"),
            delete("/users/suite-limit_test_user_2"),
        ],
        bye(
            "/vhosts/suite-limit_test_vhost_1",
            "/users/suite-limit_test_user_1",
            "/users/suite-limit_test_user_2",
        ),
    ),
    Scenario(
        "user_limit_set_test",
        [
            user("suite-limit_test_user_1"),
            get("/user-limits/suite-limit_test_user_1"),
            put("/user-limits/suite-limit_test_user_1/max-channels", {"value": 100}),
            get("/user-limits/suite-limit_test_user_1"),
            put("/user-limits/suite-limit_test_user_1/max-connections", {"value": 200}),
            get("/user-limits/suite-limit_test_user_1"),
            put("/user-limits/suite-limit_test_user_1/max-connections", {"value": 1000}),
            get("/user-limits/suite-limit_test_user_1"),
            put("/vhosts/suite-limit_test_vhost_1"),
            user("suite-v1_user"),
            put("/permissions/suite-limit_test_vhost_1/suite-v1_user", ALL),
            get("/user-limits/suite-limit_test_user_1", "suite-v1_user"),
            delete("/user-limits/suite-limit_test_user_1/max-connections"),
            get("/user-limits/suite-limit_test_user_1"),
            delete("/user-limits/suite-limit_test_user_1/max-channels", "suite-v1_user"),
            put("/user-limits/suite-limit_test_user_1/max-unknown", {"value": 200}),
            delete("/vhosts/suite-limit_test_vhost_1"),
            delete("/users/suite-limit_test_user_1"),
            delete("/users/suite-v1_user"),
        ],
        bye(
            "/vhosts/suite-limit_test_vhost_1",
            "/users/suite-limit_test_user_1",
            "/users/suite-v1_user",
        ),
    ),
    Scenario(
        "cors_test (CORS off)",
        [
            Step(
                "OPTIONS",
                "/api/overview",
                headers={"Origin": "https://rabbitmq.com"},
                record="status",
            )
        ],
    ),
]

NOT_TRANSLATED.update(
    {
        "definitions_test": "posts the whole broker's definitions back; on a shared reference "
        "broker that recreates others' objects (definitions_vhost_test covers the same per vhost)",
        "definitions_server_named_queue_test": "the same whole-broker import",
        "long_definitions_test": "120 vhosts through the whole-broker import",
        "parameters_test": "needs the `test` runtime-parameter component registered by RPC",
        "cors_test (CORS on)": "enables CORS by RPC; Leveret has no CORS setting",
        "csp_headers_test": "the UI's static pages' Content-Security-Policy (not the API)",
        "auth_attempts_test": "resets RabbitMQ's auth-attempt metrics by RPC",
        "exchanges_pagination_permissions_test": "counts every exchange on the broker",
    }
)
