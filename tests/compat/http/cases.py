"""The table of management API requests, run against RabbitMQ (recorded) and Leveret.

One function per group of RabbitMQ 3.10's API reference (deps/rabbitmq_management/
priv/www/api/index.html at v3.10.8); each returns its cases. The generators below
give every endpoint the same treatment: success; a missing object and a missing
vhost; a body that is not JSON, without each required field, with each field of a
wrong type; a user without the needed tag and one without permissions in the vhost;
and, for lists, the listing parameters (page, page_size, name, use_regex, sort,
sort_reverse, columns).

The shared state (runner.Target.prepare): vhost `compat` with queues q1, q2 (3
messages), q-args, q-consumed (a consumer), exchanges x-direct, x-topic, x-fanout,
x-headers, four bindings, policy p1, operator policy op1, a max-queues limit, users
compat-mgmt (management), compat-monitor (monitoring), compat-policy (policymaker),
compat-notag (no tags), compat-noperm (management, no permissions), compat-readonly
(management, may only read), and an AMQP connection named compat-conn with two
channels. Cases that change something (`writes=True`) work on objects of their own.
To add a group: write a function returning cases and add it to GROUPS.
"""

from __future__ import annotations

from typing import Any

from .runner import NOBODY, VHOST, Case, Raw, Req

V = VHOST
NOT_JSON = Raw(b"{not json")

#: stand-ins of a wrong JSON type for a field of each type
WRONG = {"string": 5, "boolean": "maybe", "object": "text", "array": 5, "integer": "many"}


def listing(
    group: str, path: str, *, users: bool = True, sort: str = "name", name: str = "q"
) -> list[Case]:
    """A list endpoint with each listing parameter, good and bad."""
    cases = [Case(f"{group}.list", "GET", path)]
    if users:
        cases += [
            Case(f"{group}.list.as_management", "GET", path, user="compat-mgmt"),
            Case(f"{group}.list.as_monitoring", "GET", path, user="compat-monitor"),
            Case(f"{group}.list.as_no_permissions", "GET", path, user="compat-noperm"),
            Case(f"{group}.list.as_no_tag", "GET", path, user="compat-notag"),
        ]
    for suffix, query in {
        "page": {"page": "1", "page_size": "2"},
        "page2": {"page": "2", "page_size": "2"},
        "name": {"page": "1", "name": name},
        "name_upper": {"page": "1", "name": name.upper()},
        "regex": {"page": "1", "name": f"^{name}", "use_regex": "true"},
        "bad_regex": {"page": "1", "name": "[", "use_regex": "true"},
        "name_without_page": {"name": name},
        "sort": {"sort": sort},
        "sort_reverse": {"sort": sort, "sort_reverse": "true"},
        "columns": {"columns": f"{sort},vhost"},
        "page0": {"page": "0"},
        "page_out_of_range": {"page": "99"},
        "page_size_too_big": {"page": "1", "page_size": "501"},
        "page_not_a_number": {"page": "x"},
    }.items():
        cases.append(Case(f"{group}.list.{suffix}", "GET", path, query=query))
    return cases


def get(
    group: str,
    path: str,
    *,
    missing: str | None = None,
    missing_vhost: str | None = None,
    users: bool = True,
) -> list[Case]:
    """A GET of one object: success, missing object, missing vhost, each kind of user."""
    cases = [Case(f"{group}.get", "GET", path)]
    if missing:
        cases.append(Case(f"{group}.get.missing", "GET", missing))
    if missing_vhost:
        cases.append(Case(f"{group}.get.missing_vhost", "GET", missing_vhost))
    if users:
        for suffix, user in (
            ("as_management", "compat-mgmt"),
            ("as_monitoring", "compat-monitor"),
            ("as_no_permissions", "compat-noperm"),
            ("as_no_tag", "compat-notag"),
        ):
            cases.append(Case(f"{group}.get.{suffix}", "GET", path, user=user))
    return cases


def body_cases(
    group: str,
    method: str,
    path: str,
    good: dict[str, Any],
    *,
    required: tuple[str, ...] = (),
    types: dict[str, str] | None = None,
    setup: list[Req] | None = None,
    cleanup: list[Req] | None = None,
    users: tuple[str, ...] = ("compat-mgmt", "compat-noperm", "compat-notag"),
    missing_vhost: str | None = None,
    empty: bool = True,
) -> list[Case]:
    """A PUT or POST with a body: success, not JSON, {} , each required field left out,
    each field of a wrong type, a missing vhost, users without tag or permissions."""
    setup, cleanup = setup or [], cleanup or []

    def case(suffix: str, body: Any, user: str = "guest", where: str = path) -> Case:
        return Case(
            f"{group}.{suffix}",
            method,
            where,
            body,
            user,
            setup=list(setup),
            cleanup=list(cleanup),
            writes=True,
        )

    cases = [case("ok", good), case("not_json", NOT_JSON)]
    if empty:
        cases.append(case("empty_object", {}))
    for key in required:
        cases.append(case(f"without_{key}", {k: v for k, v in good.items() if k != key}))
    for key, kind in (types or {}).items():
        cases.append(case(f"wrong_type_{key}", {**good, key: WRONG[kind]}))
    if missing_vhost:
        cases.append(case("missing_vhost", good, where=missing_vhost))
    for user in users:
        cases.append(case(f"as_{user.removeprefix('compat-')}", good, user))
    return cases


def delete(
    group: str,
    path: str,
    *,
    setup: list[Req],
    missing: str | None = None,
    missing_vhost: str | None = None,
    cleanup: list[Req] | None = None,
    users: tuple[str, ...] = ("compat-mgmt", "compat-noperm", "compat-notag"),
    query: dict[str, str] | None = None,
) -> list[Case]:
    cleanup = cleanup or []
    cases = [
        Case(
            f"{group}.delete",
            "DELETE",
            path,
            setup=setup,
            cleanup=cleanup,
            writes=True,
            query=query or {},
        )
    ]
    if missing:
        cases.append(Case(f"{group}.delete.missing", "DELETE", missing, writes=True))
    if missing_vhost:
        cases.append(Case(f"{group}.delete.missing_vhost", "DELETE", missing_vhost, writes=True))
    for user in users:
        cases.append(
            Case(
                f"{group}.delete.as_{user.removeprefix('compat-')}",
                "DELETE",
                path,
                user=user,
                setup=setup,
                cleanup=cleanup,
                writes=True,
            )
        )
    return cases


# --- groups ------------------------------------------------------------------------------


def overview() -> list[Case]:
    cases = get("overview", "/api/overview")
    cases += [
        Case("overview.get.bad_password", "GET", "/api/overview", user="guest:wrong"),
        Case("overview.get.unknown_user", "GET", "/api/overview", user="compat-nobody:x"),
        Case("overview.post", "POST", "/api/overview", {}),
        Case("whoami.get", "GET", "/api/whoami"),
        Case("whoami.get.as_management", "GET", "/api/whoami", user="compat-mgmt"),
        Case("whoami.get.as_no_tag", "GET", "/api/whoami", user="compat-notag"),
        Case("cluster_name.get", "GET", "/api/cluster-name", volatile=("name",)),
        Case(
            "cluster_name.get.as_management",
            "GET",
            "/api/cluster-name",
            user="compat-mgmt",
            volatile=("name",),
        ),
        Case("extensions.get", "GET", "/api/extensions"),
        Case("unknown_path.get", "GET", "/api/no-such-thing"),
        Case("unknown_path.get.deep", "GET", "/api/queues/compat/q1/no/such/thing"),
        Case("unknown_path.delete", "DELETE", "/api/no-such-thing"),
        Case("unknown_path.unauthenticated", "GET", "/api/no-such-thing", user="guest:wrong"),
    ]
    return cases


def nodes() -> list[Case]:
    return [
        *listing("nodes", "/api/nodes", name="refrabbit"),
        *get("nodes", "/api/nodes/{node}", missing="/api/nodes/rabbit@nowhere"),
    ]


#: RabbitMQ exports each list in its tables' hash order: compared in a canonical order
DEFINITION_LISTS = (
    "users",
    "vhosts",
    "permissions",
    "topic_permissions",
    "parameters",
    "policies",
    "queues",
    "exchanges",
    "bindings",
)


def definitions() -> list[Case]:
    cases = get("definitions", "/api/definitions")
    cases += get(
        "definitions.vhost", f"/api/definitions/{V}", missing_vhost="/api/definitions/compat-nope"
    )
    for case in cases:
        case.unordered = DEFINITION_LISTS
    cases += body_cases(
        "definitions.post",
        "POST",
        "/api/definitions",
        {"vhosts": [{"name": "compat-tmp"}]},
        types={"vhosts": "array", "users": "array", "queues": "array"},
        cleanup=[Req("DELETE", "/api/vhosts/compat-tmp")],
    )
    cases += body_cases(
        "definitions.vhost.post",
        "POST",
        f"/api/definitions/{V}",
        {"queues": [{"name": "q-def", "durable": True, "auto_delete": False, "arguments": {}}]},
        types={"queues": "array", "exchanges": "array"},
        cleanup=[Req("DELETE", f"/api/queues/{V}/q-def")],
        missing_vhost="/api/definitions/compat-nope",
    )
    flags = {"durable": "true", "auto_delete": "false"}
    undo = [Req("DELETE", f"/api/queues/{V}/q-def"), Req("DELETE", f"/api/exchanges/{V}/x-def")]
    for suffix, body in (
        ("queue_string_booleans", {"queues": [{"name": "q-def", **flags, "arguments": {}}]}),
        (
            "exchange_string_booleans",
            {
                "exchanges": [
                    {
                        "name": "x-def",
                        "type": "direct",
                        **flags,
                        "internal": "false",
                        "arguments": {},
                    }
                ]
            },
        ),
        ("queue_without_flags", {"queues": [{"name": "q-def", "arguments": {}}]}),
    ):
        cases.append(
            Case(
                f"definitions.vhost.post.{suffix}",
                "POST",
                f"/api/definitions/{V}",
                body,
                cleanup=list(undo),
                writes=True,
            )
        )
        cases.append(
            Case(
                f"definitions.vhost.post.{suffix}.then_get",
                "GET",
                f"/api/queues/{V}/q-def" if "queue" in suffix else f"/api/exchanges/{V}/x-def",
                query={"columns": "name,durable,auto_delete,internal"},
                setup=[Req("POST", f"/api/definitions/{V}", body)],
                cleanup=list(undo),
                writes=True,
            )
        )
    return cases + import_cases()


def _queue(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "durable": True, "auto_delete": False, "arguments": arguments}


def _exchange(name: str, kind: str, **fields: Any) -> dict[str, Any]:
    flags = {"durable": True, "auto_delete": False, "internal": False, "arguments": {}}
    return {"name": name, "type": kind, **flags, **fields}


def _binding(source: str, destination: str, kind: str = "queue") -> dict[str, Any]:
    return {
        "source": source,
        "destination": destination,
        "destination_type": kind,
        "routing_key": "k-imp",
        "arguments": {},
    }


def import_cases() -> list[Case]:
    """Imports RabbitMQ refuses with the reason of the AMQP error (`precondition_failed:
    ...`), or takes while leaving something out: a queue or exchange that exists keeps
    what it has, a binding whose source or destination is missing is skipped. Each case
    is followed by one that reads back what the import left (`.then_get`)."""
    vpath = f"/api/definitions/{V}"
    undo = [
        Req("DELETE", f"/api/queues/{V}/q-imp"),
        Req("DELETE", f"/api/queues/{V}/q-imp2"),
        Req("DELETE", f"/api/exchanges/{V}/x-imp"),
        Req("DELETE", "/api/users/compat-imp"),
    ]
    made = {
        "queues": [_queue("q-imp", **{"x-max-length": 10})],
        "exchanges": [_exchange("x-imp", "direct")],
    }
    cases: list[Case] = []
    # name: (path, body, setup, what to read back)
    table: dict[str, tuple[str, Any, list[Req], str]] = {
        "queue_bad_argument": (
            vpath,
            {"queues": [_queue("q-imp", **{"x-max-length": "abc"})]},
            [],
            f"/api/queues/{V}/q-imp",
        ),
        "queue_bad_argument_after_a_good_one": (
            vpath,
            {"queues": [_queue("q-imp2"), _queue("q-imp", **{"x-max-length": "abc"})]},
            [],
            f"/api/queues/{V}/q-imp2",
        ),
        "exchange_unknown_type": (
            vpath,
            {"exchanges": [_exchange("x-imp", "nope")]},
            [],
            f"/api/exchanges/{V}/x-imp",
        ),
        "queue_exists_other_arguments": (
            vpath,
            {"queues": [_queue("q-imp", **{"x-max-length": 20})]},
            [Req("POST", vpath, made)],
            f"/api/queues/{V}/q-imp",
        ),
        "queue_exists_other_flags": (
            vpath,
            {"queues": [{**_queue("q-imp"), "durable": False, "auto_delete": True}]},
            [Req("POST", vpath, made)],
            f"/api/queues/{V}/q-imp",
        ),
        "queue_exists_bad_argument": (
            vpath,
            {"queues": [_queue("q-imp", **{"x-max-length": "abc"})]},
            [Req("POST", vpath, made)],
            f"/api/queues/{V}/q-imp",
        ),
        "exchange_exists_other_type": (
            vpath,
            {"exchanges": [_exchange("x-imp", "topic", durable=False)]},
            [Req("POST", vpath, made)],
            f"/api/exchanges/{V}/x-imp",
        ),
        "exchange_exists_unknown_type": (
            vpath,
            {"exchanges": [_exchange("x-imp", "nope")]},
            [Req("POST", vpath, made)],
            f"/api/exchanges/{V}/x-imp",
        ),
        "binding_missing_queue": (
            vpath,
            {"bindings": [_binding("x-imp", "zz")]},
            [Req("POST", vpath, made)],
            f"/api/exchanges/{V}/x-imp/bindings/source",
        ),
        "binding_missing_source": (
            vpath,
            {"bindings": [_binding("x-imp-nope", "q-imp")]},
            [Req("POST", vpath, made)],
            f"/api/queues/{V}/q-imp/bindings",
        ),
        "binding_missing_destination_exchange": (
            vpath,
            {"bindings": [_binding("x-imp", "x-imp-nope", "exchange")]},
            [Req("POST", vpath, made)],
            f"/api/exchanges/{V}/x-imp/bindings/source",
        ),
        "binding_and_its_queue": (
            vpath,
            {"queues": [_queue("q-imp")], "bindings": [_binding("amq.direct", "q-imp")]},
            [],
            f"/api/queues/{V}/q-imp/bindings",
        ),
        "queue_missing_vhost": (
            "/api/definitions",
            {"queues": [{**_queue("q-imp"), "vhost": "compat-nope"}]},
            [],
            "/api/vhosts/compat-nope",
        ),
        "permission_missing_vhost": (
            "/api/definitions",
            {
                "users": [{"name": "compat-imp", "password": "x", "tags": ""}],
                "permissions": [
                    {
                        "user": "compat-imp",
                        "vhost": "compat-nope",
                        "configure": ".*",
                        "write": ".*",
                        "read": ".*",
                    }
                ],
            },
            [],
            "/api/users/compat-imp",
        ),
        "permission_missing_user": (
            "/api/definitions",
            {
                "permissions": [
                    {"user": "compat-imp", "vhost": V, "configure": ".*", "write": "", "read": ""}
                ]
            },
            [],
            f"/api/permissions/{V}/compat-imp",
        ),
        "json_array": (vpath, [1, 2], [], f"/api/queues/{V}/q-imp"),
        "queues_not_a_list": (vpath, {"queues": "nope"}, [], f"/api/queues/{V}/q-imp"),
    }
    for suffix, (path, body, setup, read_back) in table.items():
        name = f"definitions.import.{suffix}"
        common = {"cleanup": list(undo), "writes": True}
        cases.append(Case(name, "POST", path, body, setup=list(setup), **common))
        cases.append(
            Case(
                f"{name}.then_get",
                "GET",
                read_back,
                query={"columns": "name,type,durable,auto_delete,arguments,source,destination"}
                if "bindings" not in read_back and "permissions" not in read_back
                else {},
                setup=[*setup, Req("POST", path, body)],
                **common,
            )
        )
    return cases


def connections() -> list[Case]:
    cases = listing("connections", "/api/connections", name="127")
    cases += listing("vhost_connections", f"/api/vhosts/{V}/connections", users=False, name="127")
    cases += [
        Case("vhost_connections.list.missing_vhost", "GET", "/api/vhosts/compat-nope/connections")
    ]
    cases += get("connections", "/api/connections/{conn}", missing="/api/connections/nope")
    cases += get(
        "connection_channels",
        "/api/connections/{conn}/channels",
        missing="/api/connections/nope/channels",
    )
    cases += listing("connection_channels", "/api/connections/{conn}/channels", users=False)
    cases += get(
        "user_connections",
        "/api/connections/username/guest",
        missing="/api/connections/username/compat-nobody",
    )
    cases += [
        Case(
            "user_connections.get.own",
            "GET",
            "/api/connections/username/compat-mgmt",
            user="compat-mgmt",
        ),
        Case("connections.delete.missing", "DELETE", "/api/connections/nope", writes=True),
        Case(
            "connections.delete",
            "DELETE",
            "/api/connections/{conn_compat-monitor}",
            setup=[Req("AMQP", "", user="compat-monitor")],
            writes=True,
        ),
        Case(
            "connections.delete.as_management",
            "DELETE",
            "/api/connections/{conn_compat-policy}",
            setup=[Req("AMQP", "", user="compat-policy")],
            user="compat-mgmt",
            writes=True,
        ),
        Case(
            "connections.delete.own",
            "DELETE",
            "/api/connections/{conn_compat-readonly}",
            setup=[Req("AMQP", "", user="compat-readonly")],
            user="compat-readonly",
            writes=True,
        ),
        Case(
            "user_connections.delete",
            "DELETE",
            "/api/connections/username/compat-mgmt",
            setup=[Req("AMQP", "", user="compat-mgmt")],
            writes=True,
        ),
        Case(
            "user_connections.delete.as_management",
            "DELETE",
            "/api/connections/username/guest",
            user="compat-mgmt",
            writes=True,
        ),
    ]
    return cases


def channels() -> list[Case]:
    cases = listing("channels", "/api/channels", name="127")
    cases += listing("vhost_channels", f"/api/vhosts/{V}/channels", users=False, name="127")
    cases += [Case("vhost_channels.list.missing_vhost", "GET", "/api/vhosts/compat-nope/channels")]
    cases += get("channels", "/api/channels/{channel1}", missing="/api/channels/nope")
    cases += [Case("channels.get.second", "GET", "/api/channels/{channel2}")]
    return cases


def consumers() -> list[Case]:
    cases = listing("consumers", "/api/consumers", sort="consumer_tag", name="q")
    cases += listing("vhost_consumers", f"/api/consumers/{V}", users=False, sort="consumer_tag")
    cases += [Case("vhost_consumers.list.missing_vhost", "GET", "/api/consumers/compat-nope")]
    return cases


def exchanges() -> list[Case]:
    x = f"/api/exchanges/{V}"
    fresh = [Req("DELETE", f"{x}/x-new")]
    cases = listing("exchanges", "/api/exchanges", name="x-")
    cases += listing("vhost_exchanges", x, users=False, name="x-")
    cases += [Case("vhost_exchanges.list.missing_vhost", "GET", "/api/exchanges/compat-nope")]
    for name in ("x-direct", "x-topic", "x-headers", "amq.default", "amq.topic"):
        cases += get(
            f"exchanges.{name}",
            f"{x}/{name}",
            users=name == "x-direct",
            missing=f"{x}/x-nope" if name == "x-direct" else None,
            missing_vhost="/api/exchanges/compat-nope/x-direct" if name == "x-direct" else None,
        )
    cases += [Case("exchanges.get.as_readonly", "GET", f"{x}/x-direct", user="compat-readonly")]
    for side in ("source", "destination"):
        cases += listing(
            f"exchange_bindings_{side}",
            f"{x}/x-direct/bindings/{side}",
            users=False,
            sort="routing_key",
            name="k",
        )
        cases += get(
            f"exchange_bindings_{side}",
            f"{x}/x-fanout/bindings/{side}",
            missing=f"{x}/x-nope/bindings/{side}",
            missing_vhost=f"/api/exchanges/compat-nope/x-direct/bindings/{side}",
        )
    cases += body_cases(
        "exchanges.put",
        "PUT",
        f"{x}/x-new",
        {
            "type": "topic",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": {"alternate-exchange": "x-direct"},
        },
        types={
            "type": "string",
            "durable": "boolean",
            "auto_delete": "boolean",
            "internal": "boolean",
            "arguments": "object",
        },
        cleanup=fresh,
        missing_vhost="/api/exchanges/compat-nope/x-new",
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    cases += [
        Case(
            "exchanges.put.string_booleans",
            "PUT",
            f"{x}/x-new",
            {"type": "direct", "durable": "true", "auto_delete": "false", "internal": "false"},
            cleanup=fresh,
            writes=True,
        ),
        Case(
            "exchanges.put.unknown_type",
            "PUT",
            f"{x}/x-new",
            {"type": "x-nope"},
            cleanup=fresh,
            writes=True,
        ),
        Case("exchanges.put.inequivalent", "PUT", f"{x}/x-direct", {"type": "fanout"}, writes=True),
        Case(
            "exchanges.put.same_again",
            "PUT",
            f"{x}/x-direct",
            {"type": "direct", "durable": True},
            writes=True,
        ),
        Case(
            "exchanges.put.amq_prefix",
            "PUT",
            f"{x}/amq.compat",
            {"type": "direct"},
            cleanup=[Req("DELETE", f"{x}/amq.compat")],
            writes=True,
        ),
        Case("exchanges.put.default", "PUT", f"{x}/amq.default", {"type": "direct"}, writes=True),
        Case(
            "exchanges.delete.if_unused_in_use",
            "DELETE",
            f"{x}/x-direct",
            query={"if-unused": "true"},
            writes=True,
        ),
        Case("exchanges.delete.default", "DELETE", f"{x}/amq.default", writes=True),
        Case("exchanges.delete.amq_direct", "DELETE", f"{x}/amq.direct", writes=True),
    ]
    make = [Req("PUT", f"{x}/x-del", {"type": "direct"})]
    cases += delete(
        "exchanges",
        f"{x}/x-del",
        setup=make,
        missing=f"{x}/x-nope",
        missing_vhost="/api/exchanges/compat-nope/x-del",
        cleanup=[Req("DELETE", f"{x}/x-del")],
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    pub = [
        Req("PUT", f"/api/queues/{V}/q-pub", {}),
        Req("POST", f"/api/bindings/{V}/e/x-direct/q/q-pub", {"routing_key": "pub"}),
    ]
    cases += body_cases(
        "exchanges.publish",
        "POST",
        f"{x}/x-direct/publish",
        {
            "properties": {"delivery_mode": 2, "headers": {"h": 1}},
            "routing_key": "pub",
            "payload": "hello",
            "payload_encoding": "string",
        },
        required=("properties", "routing_key", "payload", "payload_encoding"),
        types={
            "properties": "object",
            "routing_key": "string",
            "payload": "string",
            "payload_encoding": "string",
        },
        setup=pub,
        cleanup=[Req("DELETE", f"/api/queues/{V}/q-pub")],
        missing_vhost="/api/exchanges/compat-nope/x-direct/publish",
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    good = {
        "properties": {},
        "routing_key": "nowhere",
        "payload": "aGk=",
        "payload_encoding": "base64",
    }
    cases += [
        Case(
            "exchanges.publish.unroutable_base64",
            "POST",
            f"{x}/x-direct/publish",
            good,
            writes=True,
        ),
        Case(
            "exchanges.publish.missing_exchange", "POST", f"{x}/x-nope/publish", good, writes=True
        ),
        Case(
            "exchanges.publish.bad_encoding",
            "POST",
            f"{x}/x-direct/publish",
            {**good, "payload_encoding": "utf-16"},
            writes=True,
        ),
        Case(
            "exchanges.publish.bad_base64",
            "POST",
            f"{x}/x-direct/publish",
            {**good, "payload": "!!!"},
            writes=True,
        ),
        Case(
            "exchanges.publish.bad_property",
            "POST",
            f"{x}/x-direct/publish",
            {**good, "properties": {"delivery_mode": "x"}},
            writes=True,
        ),
        Case(
            "exchanges.publish.unknown_property",
            "POST",
            f"{x}/x-direct/publish",
            {**good, "properties": {"nope": 1}},
            writes=True,
        ),
        Case(
            "exchanges.publish.default_exchange",
            "POST",
            f"{x}/amq.default/publish",
            {**good, "routing_key": "q-nope"},
            writes=True,
        ),
    ]
    cases += exchange_parity()
    return cases


def queues() -> list[Case]:
    q = f"/api/queues/{V}"
    fresh = [Req("DELETE", f"{q}/q-new")]
    cases = listing("queues", "/api/queues")
    cases += listing("vhost_queues", q, users=False)
    cases += [Case("vhost_queues.list.missing_vhost", "GET", "/api/queues/compat-nope")]
    for name in ("q1", "q2", "q-args", "q-consumed"):
        cases += get(
            f"queues.{name}",
            f"{q}/{name}",
            users=name == "q1",
            missing=f"{q}/q-nope" if name == "q1" else None,
            missing_vhost="/api/queues/compat-nope/q1" if name == "q1" else None,
        )
    cases += [Case("queues.get.as_readonly", "GET", f"{q}/q1", user="compat-readonly")]
    cases += listing("queue_bindings", f"{q}/q1/bindings", users=False, sort="source", name="x")
    cases += get(
        "queue_bindings",
        f"{q}/q1/bindings",
        missing=f"{q}/q-nope/bindings",
        missing_vhost="/api/queues/compat-nope/q1/bindings",
    )
    cases += body_cases(
        "queues.put",
        "PUT",
        f"{q}/q-new",
        {"durable": True, "auto_delete": False, "arguments": {"x-message-ttl": 1000}},
        types={"durable": "boolean", "auto_delete": "boolean", "arguments": "object"},
        cleanup=fresh,
        missing_vhost="/api/queues/compat-nope/q-new",
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    cases += [
        Case(
            "queues.put.string_booleans",
            "PUT",
            f"{q}/q-new",
            {"durable": "false", "auto_delete": "true"},
            cleanup=fresh,
            writes=True,
        ),
        Case(
            "queues.put.bad_argument",
            "PUT",
            f"{q}/q-new",
            {"arguments": {"x-max-length": "ten"}},
            cleanup=fresh,
            writes=True,
        ),
        Case("queues.put.inequivalent", "PUT", f"{q}/q1", {"durable": False}, writes=True),
        Case("queues.put.same_again", "PUT", f"{q}/q1", {"durable": True}, writes=True),
        Case("queues.put.amq_prefix", "PUT", f"{q}/amq.compat", {}, writes=True),
        Case(
            "queues.put.quorum_not_durable",
            "PUT",
            f"{q}/q-new",
            {"durable": False, "arguments": {"x-queue-type": "quorum"}},
            cleanup=fresh,
            writes=True,
        ),
    ]
    make = [Req("PUT", f"{q}/q-del", {"durable": False})]
    full = [
        *make,
        Req(
            "POST",
            "/api/exchanges/compat/amq.default/publish",
            {
                "properties": {},
                "routing_key": "q-del",
                "payload": "x",
                "payload_encoding": "string",
            },
        ),
    ]
    gone = [Req("DELETE", f"{q}/q-del")]
    cases += delete(
        "queues",
        f"{q}/q-del",
        setup=make,
        missing=f"{q}/q-nope",
        missing_vhost="/api/queues/compat-nope/q-del",
        cleanup=gone,
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    cases += [
        Case(
            "queues.delete.if_empty_not_empty",
            "DELETE",
            f"{q}/q-del",
            query={"if-empty": "true"},
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.delete.if_empty_empty",
            "DELETE",
            f"{q}/q-del",
            query={"if-empty": "true"},
            setup=make,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.delete.if_unused_in_use",
            "DELETE",
            f"{q}/q-consumed",
            query={"if-unused": "true"},
            writes=True,
        ),
    ]
    cases += delete(
        "queues.contents",
        f"{q}/q-del/contents",
        setup=full,
        missing=f"{q}/q-nope/contents",
        missing_vhost="/api/queues/compat-nope/q-del/contents",
        cleanup=gone,
        users=("compat-mgmt", "compat-noperm", "compat-readonly"),
    )
    cases += body_cases(
        "queues.get_messages",
        "POST",
        f"{q}/q-del/get",
        {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50000},
        required=("count", "ackmode", "encoding"),
        types={
            "count": "integer",
            "ackmode": "string",
            "encoding": "string",
            "truncate": "integer",
        },
        setup=full,
        cleanup=gone,
        missing_vhost="/api/queues/compat-nope/q-del/get",
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    get_body = {"count": 5, "ackmode": "ack_requeue_false", "encoding": "base64"}
    cases += [
        Case(
            "queues.get_messages.base64_ack",
            "POST",
            f"{q}/q-del/get",
            get_body,
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.get_messages.reject",
            "POST",
            f"{q}/q-del/get",
            {**get_body, "ackmode": "reject_requeue_true", "encoding": "auto"},
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.get_messages.truncate",
            "POST",
            f"{q}/q-del/get",
            {**get_body, "truncate": 0},
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.get_messages.bad_ackmode",
            "POST",
            f"{q}/q-del/get",
            {**get_body, "ackmode": "keep"},
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.get_messages.bad_encoding",
            "POST",
            f"{q}/q-del/get",
            {**get_body, "encoding": "utf-16"},
            setup=full,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "queues.get_messages.empty_queue",
            "POST",
            f"{q}/q-del/get",
            get_body,
            setup=make,
            cleanup=gone,
            writes=True,
        ),
        Case("queues.get_messages.missing", "POST", f"{q}/q-nope/get", get_body, writes=True),
    ]
    cases += queue_parity()
    return cases


def bindings() -> list[Case]:
    b = f"/api/bindings/{V}"
    cases = listing("bindings", "/api/bindings", sort="source", name="x")
    cases += listing("vhost_bindings", b, users=False, sort="source", name="x")
    cases += [Case("vhost_bindings.list.missing_vhost", "GET", "/api/bindings/compat-nope")]
    cases += get(
        "bindings_eq",
        f"{b}/e/x-direct/q/q1",
        missing=f"{b}/e/x-direct/q/q-nope",
        missing_vhost="/api/bindings/compat-nope/e/x-direct/q/q1",
    )
    cases += [Case("bindings_eq.get.missing_source", "GET", f"{b}/e/x-nope/q/q1")]
    cases += get(
        "bindings_ee", f"{b}/e/x-direct/e/x-fanout", users=False, missing=f"{b}/e/x-direct/e/x-nope"
    )
    cases += get(
        "binding_eq",
        f"{b}/e/x-direct/q/q1/k1",
        missing=f"{b}/e/x-direct/q/q1/k-nope",
        missing_vhost="/api/bindings/compat-nope/e/x-direct/q/q1/k1",
    )
    cases += [
        Case("binding_eq.get.with_arguments", "GET", f"{b}/e/x-headers/q/q1/{{props_args}}"),
        Case("binding_eq.get.missing_queue", "GET", f"{b}/e/x-direct/q/q-nope/k1"),
        Case("binding_ee.get", "GET", f"{b}/e/x-direct/e/x-fanout/k2"),
        Case("binding_ee.get.missing", "GET", f"{b}/e/x-direct/e/x-fanout/k-nope"),
    ]
    undo = [Req("DELETE", f"{b}/e/x-topic/q/q1/new.key")]
    cases += body_cases(
        "bindings_eq.post",
        "POST",
        f"{b}/e/x-topic/q/q1",
        {"routing_key": "new.key", "arguments": {}},
        types={"routing_key": "string", "arguments": "object"},
        cleanup=undo,
        missing_vhost="/api/bindings/compat-nope/e/x-topic/q/q1",
        users=("compat-mgmt", "compat-noperm", "compat-notag", "compat-readonly"),
    )
    cases += [
        Case(
            "bindings_eq.post.missing_queue",
            "POST",
            f"{b}/e/x-topic/q/q-nope",
            {"routing_key": "k"},
            writes=True,
        ),
        Case(
            "bindings_eq.post.missing_exchange",
            "POST",
            f"{b}/e/x-nope/q/q1",
            {"routing_key": "k"},
            writes=True,
        ),
        Case(
            "bindings_eq.post.default_exchange",
            "POST",
            f"{b}/e/amq.default/q/q1",
            {"routing_key": "k"},
            writes=True,
        ),
        Case(
            "bindings_ee.post",
            "POST",
            f"{b}/e/x-topic/e/x-fanout",
            {"routing_key": "e.k"},
            cleanup=[Req("DELETE", f"{b}/e/x-topic/e/x-fanout/e.k")],
            writes=True,
        ),
    ]
    make = [Req("POST", f"{b}/e/x-topic/q/q1", {"routing_key": "del.key"})]
    cases += delete(
        "binding_eq",
        f"{b}/e/x-topic/q/q1/del.key",
        setup=make,
        missing=f"{b}/e/x-topic/q/q1/k-nope",
        missing_vhost="/api/bindings/compat-nope/e/x-topic/q/q1/del.key",
        cleanup=[Req("DELETE", f"{b}/e/x-topic/q/q1/del.key")],
        users=("compat-mgmt", "compat-noperm", "compat-readonly"),
    )
    cases += delete(
        "binding_ee",
        f"{b}/e/x-topic/e/x-fanout/del.key",
        setup=[Req("POST", f"{b}/e/x-topic/e/x-fanout", {"routing_key": "del.key"})],
        missing=f"{b}/e/x-topic/e/x-fanout/k-nope",
        cleanup=[Req("DELETE", f"{b}/e/x-topic/e/x-fanout/del.key")],
        users=(),
    )
    cases += binding_keys()
    return cases


def vhosts() -> list[Case]:
    cases = listing("vhosts", "/api/vhosts", name="comp")
    cases += get("vhosts", f"/api/vhosts/{V}", missing="/api/vhosts/compat-nope")
    cases += [Case("vhosts.get.default", "GET", "/api/vhosts/%2F", volatile=("message_stats",))]
    for what in ("permissions", "topic-permissions"):
        cases += get(
            f"vhost_{what}", f"/api/vhosts/{V}/{what}", missing=f"/api/vhosts/compat-nope/{what}"
        )
        cases += listing(
            f"vhost_{what}", f"/api/vhosts/{V}/{what}", users=False, sort="user", name="compat"
        )
    gone = [Req("DELETE", "/api/vhosts/compat-new")]
    cases += body_cases(
        "vhosts.put",
        "PUT",
        "/api/vhosts/compat-new",
        {"description": "new one", "tags": "t1,t2", "tracing": False},
        types={"description": "string", "tags": "string", "tracing": "boolean"},
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor", "compat-notag"),
    )
    cases += [
        Case("vhosts.put.no_body", "PUT", "/api/vhosts/compat-new", cleanup=gone, writes=True),
        Case(
            "vhosts.put.tags_list",
            "PUT",
            "/api/vhosts/compat-new",
            {"tags": ["t1"]},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "vhosts.put.again",
            "PUT",
            f"/api/vhosts/{V}",
            {"description": "compat vhost"},
            writes=True,
        ),
        Case(
            "vhosts.put.grants_creator",
            "GET",
            "/api/permissions/compat-new/guest",
            setup=[Req("PUT", "/api/vhosts/compat-new", {})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "vhosts.put.creator_can_use",
            "PUT",
            "/api/queues/compat-new/q",
            {"durable": False},
            setup=[Req("PUT", "/api/vhosts/compat-new", {})],
            cleanup=gone,
            writes=True,
        ),
    ]
    # a body that is not UTF-8 (a Latin-1 é): RabbitMQ reads the byte as U+FFFD
    latin1 = Raw(b'{"description": "caf\xe9"}')
    cases += [
        Case(
            "vhost_utf8.put.latin1_body",
            "PUT",
            "/api/vhosts/compat-new",
            latin1,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "vhost_utf8.put.latin1_body.then_get",
            "GET",
            "/api/vhosts/compat-new",
            query={"columns": "name,description"},
            setup=[Req("PUT", "/api/vhosts/compat-new", latin1)],
            cleanup=gone,
            writes=True,
        ),
    ]
    # tracing as a string boolean (the GET asks only for name and tracing: a vhost's
    # message counts would need a fresh RabbitMQ to record)
    for suffix, value in (("string_true", "true"), ("string_false", "false"), ("true", True)):
        cases += [
            Case(
                f"vhost_tracing.put.{suffix}",
                "PUT",
                "/api/vhosts/compat-new",
                {"tracing": value},
                cleanup=gone,
                writes=True,
            ),
            Case(
                f"vhost_tracing.put.{suffix}.then_get",
                "GET",
                "/api/vhosts/compat-new",
                query={"columns": "name,tracing"},
                setup=[Req("PUT", "/api/vhosts/compat-new", {"tracing": value})],
                cleanup=gone,
                writes=True,
            ),
        ]
    cases += delete(
        "vhosts",
        "/api/vhosts/compat-new",
        setup=[Req("PUT", "/api/vhosts/compat-new", {})],
        missing="/api/vhosts/compat-nope",
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor"),
    )
    return cases


def users() -> list[Case]:
    cases = listing("users", "/api/users", name="compat")
    cases += get("users", "/api/users/compat-mgmt", missing="/api/users/compat-nobody")
    cases += [Case("users.get.own", "GET", "/api/users/compat-mgmt", user="compat-mgmt")]
    cases += listing(
        "users_without_permissions", "/api/users/without-permissions", users=False, name="compat"
    )
    cases += [
        Case(
            "users_without_permissions.list.as_management",
            "GET",
            "/api/users/without-permissions",
            user="compat-mgmt",
        )
    ]
    for what in ("permissions", "topic-permissions"):
        cases += get(
            f"user_{what}",
            f"/api/users/compat-mgmt/{what}",
            missing=f"/api/users/compat-nobody/{what}",
        )
        cases += listing(
            f"user_{what}",
            f"/api/users/compat-mgmt/{what}",
            users=False,
            sort="vhost",
            name="compat",
        )
    gone = [Req("DELETE", "/api/users/compat-new")]
    cases += body_cases(
        "users.put",
        "PUT",
        "/api/users/compat-new",
        {"password": "secret", "tags": "management"},
        types={"password": "string", "tags": "string"},
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor"),
    )
    cases += [
        Case(
            "users.put.hash",
            "PUT",
            "/api/users/compat-new",
            {
                "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": "",
            },
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.bad_hash",
            "PUT",
            "/api/users/compat-new",
            {"password_hash": "not base64!", "tags": ""},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.bad_algorithm",
            "PUT",
            "/api/users/compat-new",
            {
                "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                "hashing_algorithm": "nope",
                "tags": "",
            },
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.tags_list",
            "PUT",
            "/api/users/compat-new",
            {"password": "x", "tags": ["management", "monitoring"]},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.both",
            "PUT",
            "/api/users/compat-new",
            {"password": "x", "password_hash": "", "tags": ""},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.update_tags_only",
            "PUT",
            "/api/users/compat-new",
            {"tags": "monitoring"},
            setup=[Req("PUT", "/api/users/compat-new", {"password": "x", "tags": ""})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.own_password",
            "PUT",
            "/api/users/compat-mgmt",
            {"password": "changed", "tags": "management"},
            user="compat-mgmt",
            writes=True,
        ),
    ]
    make = [Req("PUT", "/api/users/compat-new", {"password": "x", "tags": ""})]
    cases += delete(
        "users",
        "/api/users/compat-new",
        setup=make,
        missing="/api/users/compat-nobody",
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor"),
    )
    bulk = [Req("PUT", f"/api/users/compat-bulk{i}", {"password": "x", "tags": ""}) for i in (1, 2)]
    bulk_gone = [Req("DELETE", f"/api/users/compat-bulk{i}") for i in (1, 2)]
    cases += body_cases(
        "users.bulk_delete",
        "POST",
        "/api/users/bulk-delete",
        {"users": ["compat-bulk1", "compat-bulk2"]},
        required=("users",),
        types={"users": "array"},
        setup=bulk,
        cleanup=bulk_gone,
        users=("compat-mgmt",),
        empty=False,
    )
    cases += [
        Case(
            "users.bulk_delete.unknown",
            "POST",
            "/api/users/bulk-delete",
            {"users": ["compat-bulk1", "compat-nobody", "compat-bulk2"]},
            setup=bulk,
            cleanup=bulk_gone,
            writes=True,
        ),
        Case(
            "users.bulk_delete.names_not_strings",
            "POST",
            "/api/users/bulk-delete",
            {"users": [1, 2]},
            writes=True,
        ),
    ]
    cases += users_without_password()
    return cases


def permissions() -> list[Case]:
    p = f"/api/permissions/{V}"
    cases = listing("permissions", "/api/permissions", sort="user", name="compat")
    cases += get(
        "permissions",
        f"{p}/compat-mgmt",
        missing=f"{p}/compat-noperm",
        missing_vhost="/api/permissions/compat-nope/compat-mgmt",
    )
    cases += [Case("permissions.get.missing_user", "GET", f"{p}/compat-nobody")]
    make = [Req("PUT", "/api/users/compat-new", {"password": "x", "tags": ""})]
    gone = [Req("DELETE", "/api/users/compat-new")]
    cases += body_cases(
        "permissions.put",
        "PUT",
        f"{p}/compat-new",
        {"configure": ".*", "write": "^a", "read": ""},
        required=("configure", "write", "read"),
        types={"configure": "string", "write": "string", "read": "string"},
        setup=make,
        cleanup=gone,
        missing_vhost="/api/permissions/compat-nope/compat-new",
        users=("compat-mgmt", "compat-monitor"),
    )
    cases += [
        Case(
            "permissions.put.missing_user",
            "PUT",
            f"{p}/compat-nobody",
            {"configure": ".*", "write": ".*", "read": ".*"},
            writes=True,
        ),
        Case(
            "permissions.put.bad_regex",
            "PUT",
            f"{p}/compat-new",
            {"configure": "(", "write": ".*", "read": ".*"},
            setup=make,
            cleanup=gone,
            writes=True,
        ),
    ]
    with_perm = [*make, Req("PUT", f"{p}/compat-new", {"configure": "", "write": "", "read": ""})]
    cases += delete(
        "permissions",
        f"{p}/compat-new",
        setup=with_perm,
        missing=f"{p}/compat-noperm",
        missing_vhost="/api/permissions/compat-nope/compat-mgmt",
        cleanup=gone,
        users=("compat-mgmt",),
    )
    return cases


def topic_permissions() -> list[Case]:
    p = f"/api/topic-permissions/{V}"
    cases = listing("topic_permissions", "/api/topic-permissions", sort="user", name="compat")
    cases += get(
        "topic_permissions",
        f"{p}/compat-mgmt",
        missing=f"{p}/compat-noperm",
        missing_vhost="/api/topic-permissions/compat-nope/compat-mgmt",
    )
    cases += [Case("topic_permissions.get.missing_user", "GET", f"{p}/compat-nobody")]
    make = [Req("PUT", "/api/users/compat-new", {"password": "x", "tags": ""})]
    gone = [Req("DELETE", "/api/users/compat-new")]
    cases += body_cases(
        "topic_permissions.put",
        "PUT",
        f"{p}/compat-new",
        {"exchange": "x-topic", "write": "^a", "read": ".*"},
        required=("exchange", "write", "read"),
        types={"exchange": "string", "write": "string", "read": "string"},
        setup=make,
        cleanup=gone,
        missing_vhost="/api/topic-permissions/compat-nope/compat-new",
        users=("compat-mgmt",),
    )
    with_perm = [
        *make,
        Req("PUT", f"{p}/compat-new", {"exchange": "x-topic", "write": "", "read": ""}),
    ]
    cases += delete(
        "topic_permissions",
        f"{p}/compat-new",
        setup=with_perm,
        missing=f"{p}/compat-noperm",
        cleanup=gone,
        users=("compat-mgmt",),
    )
    cases += [
        Case(
            "topic_permissions.delete.one_exchange",
            "DELETE",
            f"{p}/compat-new",
            query={"exchange": "x-topic"},
            setup=with_perm,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "topic_permissions.delete.other_exchange",
            "DELETE",
            f"{p}/compat-new",
            query={"exchange": "x-other"},
            setup=with_perm,
            cleanup=gone,
            writes=True,
        ),
    ]
    return cases


def policies() -> list[Case]:
    cases: list[Case] = []
    for kind, name in (("policies", "p1"), ("operator-policies", "op1")):
        g = kind.replace("-", "_")
        p = f"/api/{kind}/{V}"
        cases += listing(g, f"/api/{kind}", name="p")
        cases += listing(f"vhost_{g}", p, users=False, name="p")
        cases += [Case(f"vhost_{g}.list.missing_vhost", "GET", f"/api/{kind}/compat-nope")]
        cases += get(
            g, f"{p}/{name}", missing=f"{p}/p-nope", missing_vhost=f"/api/{kind}/compat-nope/{name}"
        )
        gone = [Req("DELETE", f"{p}/p-new")]
        cases += body_cases(
            f"{g}.put",
            "PUT",
            f"{p}/p-new",
            {
                "pattern": "^zz",
                "definition": {"max-length": 5},
                "priority": 1,
                "apply-to": "queues",
            },
            required=("pattern", "definition"),
            types={
                "pattern": "string",
                "definition": "object",
                "priority": "integer",
                "apply-to": "string",
            },
            cleanup=gone,
            missing_vhost=f"/api/{kind}/compat-nope/p-new",
            users=("compat-mgmt", "compat-policy", "compat-monitor"),
        )
        cases += [
            Case(
                f"{g}.put.bad_apply_to",
                "PUT",
                f"{p}/p-new",
                {"pattern": "x", "definition": {"max-length": 5}, "apply-to": "nope"},
                cleanup=gone,
                writes=True,
            ),
            Case(
                f"{g}.put.bad_definition",
                "PUT",
                f"{p}/p-new",
                {"pattern": "x", "definition": {"max-length": "five"}},
                cleanup=gone,
                writes=True,
            ),
            Case(
                f"{g}.put.unknown_key",
                "PUT",
                f"{p}/p-new",
                {"pattern": "x", "definition": {"no-such-key": 1}},
                cleanup=gone,
                writes=True,
            ),
            Case(
                f"{g}.put.bad_pattern",
                "PUT",
                f"{p}/p-new",
                {"pattern": "(", "definition": {"max-length": 5}},
                cleanup=gone,
                writes=True,
            ),
            Case(
                f"{g}.put.priority_string",
                "PUT",
                f"{p}/p-new",
                {"pattern": "x", "definition": {"max-length": 5}, "priority": "3"},
                cleanup=gone,
                writes=True,
            ),
        ]
        make = [Req("PUT", f"{p}/p-new", {"pattern": "^zz", "definition": {"max-length": 5}})]
        cases += delete(
            g,
            f"{p}/p-new",
            setup=make,
            missing=f"{p}/p-nope",
            missing_vhost=f"/api/{kind}/compat-nope/p-new",
            cleanup=gone,
            users=("compat-mgmt", "compat-policy"),
        )
    return cases


def vhost_limits() -> list[Case]:
    p = f"/api/vhost-limits/{V}"
    cases = listing("vhost_limits", "/api/vhost-limits", sort="vhost", name="comp")
    cases += get("vhost_limits", p, missing_vhost="/api/vhost-limits/compat-nope")
    gone = [Req("DELETE", f"{p}/max-connections")]
    cases += body_cases(
        "vhost_limits.put",
        "PUT",
        f"{p}/max-connections",
        {"value": 50},
        required=("value",),
        types={"value": "integer"},
        cleanup=gone,
        missing_vhost="/api/vhost-limits/compat-nope/max-connections",
        users=("compat-mgmt", "compat-monitor"),
        empty=False,
    )
    cases += [
        Case(
            "vhost_limits.put.unknown_limit", "PUT", f"{p}/max-nothing", {"value": 5}, writes=True
        ),
        Case(
            "vhost_limits.put.negative",
            "PUT",
            f"{p}/max-connections",
            {"value": -1},
            cleanup=gone,
            writes=True,
        ),
    ]
    make = [Req("PUT", f"{p}/max-connections", {"value": 50})]
    cases += delete(
        "vhost_limits",
        f"{p}/max-connections",
        setup=make,
        missing=f"{p}/max-nothing",
        missing_vhost="/api/vhost-limits/compat-nope/max-connections",
        cleanup=gone,
        users=("compat-mgmt",),
    )
    cases += [Case("vhost_limits.delete.not_set", "DELETE", f"{p}/max-connections", writes=True)]
    return cases


def health() -> list[Case]:
    h = "/api/health/checks"
    cases: list[Case] = []
    for name, check in (
        ("alarms", "alarms"),
        ("local-alarms", "local-alarms"),
        ("virtual-hosts", "virtual-hosts"),
        ("node-is-quorum-critical", "node-is-quorum-critical"),
        ("node-is-mirror-sync-critical", "node-is-mirror-sync-critical"),
        ("port-listener", "port-listener/{amqp_port}"),
        ("protocol-listener", "protocol-listener/amqp"),
        ("protocol-listener.amqp091", "protocol-listener/amqp091"),
        ("certificate-expiration", "certificate-expiration/1/months"),
    ):
        cases += get(f"health.{name}", f"{h}/{check}", users=name == "alarms")
    cases += [
        Case("health.port-listener.closed", "GET", f"{h}/port-listener/1"),
        Case("health.port-listener.not_a_number", "GET", f"{h}/port-listener/x"),
        Case("health.protocol-listener.closed", "GET", f"{h}/protocol-listener/stomp"),
        Case("health.protocol-listener.unknown", "GET", f"{h}/protocol-listener/nope"),
        Case("health.certificate-expiration.weeks", "GET", f"{h}/certificate-expiration/2/weeks"),
        Case(
            "health.certificate-expiration.bad_unit",
            "GET",
            f"{h}/certificate-expiration/1/fortnights",
        ),
        Case(
            "health.certificate-expiration.bad_number", "GET", f"{h}/certificate-expiration/x/days"
        ),
        Case("health.unknown_check", "GET", f"{h}/nope"),
        *get(
            "aliveness", f"/api/aliveness-test/{V}", missing_vhost="/api/aliveness-test/compat-nope"
        ),
        Case(
            "aliveness.get.as_readonly", "GET", f"/api/aliveness-test/{V}", user="compat-readonly"
        ),
    ]
    cases += node_healthcheck()
    return cases


# --- endpoints other engineers built (each in a group of its own) -----------------------

#: a federation upstream in the shared state (runner.Target.prepare)
UPSTREAM = {"uri": "amqp://localhost:5999", "expires": 3600000}


def user_limits() -> list[Case]:
    """Per-user limits (the shared state gives compat-mgmt max-connections 100)."""
    p = "/api/user-limits/compat-mgmt"
    cases = listing("user_limits", "/api/user-limits", sort="user", name="compat")
    cases += get("user_limits", p, missing="/api/user-limits/compat-nobody")
    gone = [Req("DELETE", f"{p}/max-channels")]
    cases += body_cases(
        "user_limits.put",
        "PUT",
        f"{p}/max-channels",
        {"value": 20},
        required=("value",),
        types={"value": "integer"},
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor", "compat-policy"),
        empty=False,
    )
    cases += [
        Case("user_limits.put.unknown_limit", "PUT", f"{p}/max-nothing", {"value": 5}, writes=True),
        Case(
            "user_limits.put.missing_user",
            "PUT",
            "/api/user-limits/compat-nobody/max-channels",
            {"value": 5},
            writes=True,
        ),
        Case(
            "user_limits.put.negative",
            "PUT",
            f"{p}/max-channels",
            {"value": -1},
            cleanup=gone,
            writes=True,
        ),
    ]
    cases += delete(
        "user_limits",
        f"{p}/max-channels",
        setup=[Req("PUT", f"{p}/max-channels", {"value": 20})],
        missing=f"{p}/max-nothing",
        cleanup=gone,
        users=("compat-mgmt",),
    )
    return cases


def parameters() -> list[Case]:
    """Runtime parameters: a federation upstream (up1 in the shared state) and shovels."""
    up = f"/api/parameters/federation-upstream/{V}"
    cases = listing("parameters", "/api/parameters", sort="name", name="up")
    cases += listing(
        "parameters_component", "/api/parameters/federation-upstream", sort="name", name="up"
    )
    cases += listing("parameters_vhost", up, users=False, sort="name", name="up")
    for case in cases:  # RabbitMQ lists parameters in its table's hash order
        if "sort" not in case.query:
            case.unordered = ("",)
    cases += [
        Case(
            "parameters_vhost.list.missing_vhost",
            "GET",
            "/api/parameters/federation-upstream/compat-nope",
        ),
        Case("parameters_component.list.unknown", "GET", "/api/parameters/nope"),
    ]
    cases += get(
        "parameters",
        f"{up}/up1",
        missing=f"{up}/up-nope",
        missing_vhost="/api/parameters/federation-upstream/compat-nope/up1",
    )
    gone = [Req("DELETE", f"{up}/up-new")]
    cases += body_cases(
        "parameters.put",
        "PUT",
        f"{up}/up-new",
        {"value": {"uri": "amqp://localhost:5998", "max-hops": 2}},
        required=("value",),
        types={"value": "object"},
        cleanup=gone,
        missing_vhost="/api/parameters/federation-upstream/compat-nope/up-new",
        users=("compat-mgmt", "compat-policy", "compat-monitor", "compat-notag"),
    )
    cases += [
        Case(
            f"parameters.put.{name}",
            "PUT",
            f"{up}/up-new",
            {"value": value},
            cleanup=gone,
            writes=True,
        )
        for name, value in (
            ("without_uri", {"max-hops": 2}),
            ("bad_uri", {"uri": "http://nowhere"}),
            ("uri_not_a_string", {"uri": 5}),
            ("max_hops_not_a_number", {"uri": "amqp://localhost", "max-hops": "two"}),
            ("unknown_key", {"uri": "amqp://localhost", "no-such-key": 1}),
        )
    ]
    cases += [
        Case(
            "parameters.put.unknown_component",
            "PUT",
            f"/api/parameters/nope/{V}/x",
            {"value": {"a": 1}},
            writes=True,
        ),
        Case(
            "parameters.put.shovel_without_source",
            "PUT",
            f"/api/parameters/shovel/{V}/s-bad",
            {"value": {"dest-uri": "amqp://", "dest-queue": "q1"}},
            cleanup=[Req("DELETE", f"/api/parameters/shovel/{V}/s-bad")],
            writes=True,
        ),
        Case(
            "parameters.put.shovel_bad_ack_mode",
            "PUT",
            f"/api/parameters/shovel/{V}/s-bad",
            {"value": {**SHOVEL, "ack-mode": "sometimes"}},
            cleanup=[Req("DELETE", f"/api/parameters/shovel/{V}/s-bad")],
            writes=True,
        ),
    ]
    cases += delete(
        "parameters",
        f"{up}/up-new",
        setup=[Req("PUT", f"{up}/up-new", {"value": {"uri": "amqp://localhost:5998"}})],
        missing=f"{up}/up-nope",
        missing_vhost="/api/parameters/federation-upstream/compat-nope/up-new",
        cleanup=gone,
        users=("compat-mgmt", "compat-policy"),
    )
    return cases


#: a dynamic shovel from one queue of the compat vhost to another, on the same broker
SHOVEL = {
    "src-protocol": "amqp091",
    "src-uri": f"amqp:///{V}",
    "src-queue": "q-shovel-src",
    "dest-protocol": "amqp091",
    "dest-uri": f"amqp:///{V}",
    "dest-queue": "q-shovel-dst",
}


SHOVEL_TMP = {
    **SHOVEL,
    "src-uri": "amqp:///compat-tmp",
    "dest-uri": "amqp:///compat-tmp",
}


def shovels() -> list[Case]:
    """Shovel status (each case starts the shovel s1 and waits until it runs)."""
    param = f"/api/parameters/shovel/{V}/s1"
    start = [
        Req("PUT", f"/api/queues/{V}/q-shovel-src", {"durable": True}),
        Req("PUT", f"/api/queues/{V}/q-shovel-dst", {"durable": True}),
        Req("PUT", param, {"value": SHOVEL}),
        Req("WAIT", f"/api/shovels/{V}", {"state": "running"}),
    ]
    stop = [
        Req("DELETE", param),
        Req("DELETE", f"/api/queues/{V}/q-shovel-src"),
        Req("DELETE", f"/api/queues/{V}/q-shovel-dst"),
    ]
    volatile = ("timestamp",)

    def case(name: str, path: str, user: str = "guest", **kw: Any) -> Case:
        return Case(
            f"shovels.{name}",
            kw.pop("method", "GET"),
            path,
            user=user,
            setup=list(start),
            cleanup=list(stop),
            volatile=volatile,
            writes=True,
            **kw,
        )

    cases = [
        case("list", "/api/shovels"),
        case("list.as_management", "/api/shovels", "compat-mgmt"),
        case("list.as_monitoring", "/api/shovels", "compat-monitor"),
        case("list.as_no_permissions", "/api/shovels", "compat-noperm"),
        case("list.as_no_tag", "/api/shovels", "compat-notag"),
        case("vhost.list", f"/api/shovels/{V}"),
        case("vhost.list.as_no_permissions", f"/api/shovels/{V}", "compat-noperm"),
        case("vhost.list.missing_vhost", "/api/shovels/compat-nope"),
        case("get", f"/api/shovels/vhost/{V}/s1"),
        case("get.missing", f"/api/shovels/vhost/{V}/s-nope"),
        case("parameter.get", param),
        case("delete", f"/api/shovels/vhost/{V}/s1", method="DELETE"),
        case("delete.missing", f"/api/shovels/vhost/{V}/s-nope", method="DELETE"),
        case("delete.as_management", f"/api/shovels/vhost/{V}/s1", "compat-mgmt", method="DELETE"),
        case("restart", f"/api/shovels/vhost/{V}/s1/restart", method="DELETE"),
        case("restart.missing", f"/api/shovels/vhost/{V}/s-nope/restart", method="DELETE"),
    ]
    # The shovel's two connections are listed as RabbitMQ lists its direct ones. In a
    # vhost of their own: connections closed by earlier cases may still be closing.
    tmp = "compat-tmp"
    cases.append(
        Case(
            "shovels.connections",
            "GET",
            f"/api/vhosts/{tmp}/connections",
            setup=[
                Req("PUT", f"/api/vhosts/{tmp}", {}),
                Req("PUT", f"/api/parameters/shovel/{tmp}/s1", {"value": SHOVEL_TMP}),
                Req("WAIT", f"/api/shovels/{tmp}", {"state": "running"}),
                Req("WAIT", f"/api/vhosts/{tmp}/connections", {"type": "direct", "$count": 2}),
            ],
            cleanup=[Req("DELETE", f"/api/vhosts/{tmp}")],
            volatile=("name",),
            writes=True,
        )
    )
    return cases


def federation_links() -> list[Case]:
    """Federation links: none run (up1 is an upstream no policy uses)."""
    cases = listing("federation_links", "/api/federation-links", sort="vhost", name="up")
    cases += [
        Case("federation_links.vhost.list", "GET", f"/api/federation-links/{V}"),
        Case(
            "federation_links.vhost.list.as_no_permissions",
            "GET",
            f"/api/federation-links/{V}",
            user="compat-noperm",
        ),
        Case(
            "federation_links.vhost.list.missing_vhost", "GET", "/api/federation-links/compat-nope"
        ),
        Case("federation_links.down.list", "GET", "/api/federation-links/state/down"),
        Case("federation_links.vhost.down.list", "GET", f"/api/federation-links/{V}/state/down"),
        Case(
            "federation_links.restart.missing",
            "DELETE",
            f"/api/federation-links/vhost/{V}/nope/{{node}}/restart",
            writes=True,
        ),
    ]
    return cases


def global_parameters() -> list[Case]:
    """Global parameters and the cluster name. RabbitMQ keeps internal_cluster_id (made
    at its first start: the variable {cluster_id}) and cluster_name once one is set;
    every case that sets the name clears the parameter after, which brings the default
    name back."""
    gp = "/api/global-parameters"
    cases = [
        Case("global_parameters.list", "GET", gp),
        Case("global_parameters.list.columns", "GET", gp, query={"columns": "name"}),
        Case("global_parameters.list.sort", "GET", gp, query={"sort": "name"}),
        Case("global_parameters.post", "POST", gp, {}),
    ]
    for suffix, user in (
        ("as_management", "compat-mgmt"),
        ("as_monitoring", "compat-monitor"),
        ("as_policymaker", "compat-policy"),
        ("as_no_tag", "compat-notag"),
    ):
        cases.append(Case(f"global_parameters.list.{suffix}", "GET", gp, user=user))
    cases += get("global_parameters", f"{gp}/internal_cluster_id", missing=f"{gp}/compat-nope")
    cases.append(
        Case(
            "global_parameters.get.as_policymaker",
            "GET",
            f"{gp}/internal_cluster_id",
            user="compat-policy",
        )
    )
    mine = f"{gp}/compat-gp"
    gone = [Req("DELETE", mine)]
    cases += body_cases(
        "global_parameters.put",
        "PUT",
        mine,
        {"value": {"a": [1, "b"], "c": {"d": None}}},
        required=("value",),
        cleanup=gone,
        users=("compat-mgmt", "compat-monitor", "compat-policy", "compat-notag"),
    )
    cases += [
        Case(
            "global_parameters.put.existing",
            "PUT",
            mine,
            {"value": 2},
            setup=[Req("PUT", mine, {"value": 1})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "global_parameters.put.array_body",
            "PUT",
            mine,
            [{"value": 1}],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "global_parameters.put.extra_key",
            "PUT",
            mine,
            {"value": 1, "other": 2},
            cleanup=gone,
            writes=True,
        ),
    ]
    # What a PUT stores, read back, for each JSON type of value.
    for suffix, value in (
        ("string", "text"),
        ("number", 3.5),
        ("boolean", True),
        ("null", None),
        ("array", [1, "two", {"three": 3}]),
        ("object", {"a": {"b": [1, 2]}, "c": "d"}),
        ("empty_object", {}),
        ("empty_array", []),
    ):
        cases.append(
            Case(
                f"global_parameters.put.{suffix}.then_get",
                "GET",
                mine,
                setup=[Req("PUT", mine, {"value": value})],
                cleanup=gone,
                writes=True,
            )
        )
    cases.append(
        Case(
            "global_parameters.put.then_list",
            "GET",
            gp,
            setup=[Req("PUT", mine, {"value": "listed"})],
            cleanup=gone,
            writes=True,
            unordered=("",),
        )
    )
    cases += delete(
        "global_parameters",
        mine,
        setup=[Req("PUT", mine, {"value": 1})],
        missing=f"{gp}/compat-nope",
        cleanup=gone,
        users=("compat-mgmt", "compat-policy", "compat-notag"),
    )
    # cluster_name through the global parameters, and what it does to the cluster name
    name_param = f"{gp}/cluster_name"
    unset = [Req("DELETE", name_param)]
    set_gp = [Req("PUT", name_param, {"value": "compat-gp-cluster"})]
    cases += [
        Case("global_parameters.get.cluster_name_unset", "GET", name_param),
        Case(
            "global_parameters.put.cluster_name",
            "PUT",
            name_param,
            {"value": "compat-gp-cluster"},
            cleanup=unset,
            writes=True,
        ),
        Case(
            "global_parameters.put.cluster_name.then_cluster_name",
            "GET",
            "/api/cluster-name",
            setup=set_gp,
            cleanup=unset,
            writes=True,
        ),
        Case(
            "global_parameters.put.cluster_name.then_overview",
            "GET",
            "/api/overview",
            query={"columns": "cluster_name"},
            setup=set_gp,
            cleanup=unset,
            writes=True,
            stable=("cluster_name",),
        ),
        Case(
            "global_parameters.put.cluster_name_number",
            "PUT",
            name_param,
            {"value": 5},
            cleanup=unset,
            writes=True,
        ),
        Case(
            "global_parameters.delete.cluster_name",
            "DELETE",
            name_param,
            setup=set_gp,
            cleanup=unset,
            writes=True,
        ),
        Case(
            "global_parameters.delete.cluster_name.then_get",
            "GET",
            name_param,
            setup=[*set_gp, *unset],
            writes=True,
        ),
    ]
    # PUT /api/cluster-name (GET is in overview())
    cn = "/api/cluster-name"
    cases += body_cases(
        "cluster_name.put",
        "PUT",
        cn,
        {"name": "compat-cluster"},
        required=("name",),
        types={"name": "string"},
        cleanup=unset,
        users=("compat-mgmt", "compat-monitor", "compat-policy"),
    )
    set_cn = [Req("PUT", cn, {"name": "compat-cluster"})]
    cases += [
        Case(
            "cluster_name.put.name_object",
            "PUT",
            cn,
            {"name": {"a": 1}},
            cleanup=unset,
            writes=True,
        ),
        Case(
            "cluster_name.put.name_list",
            "PUT",
            cn,
            {"name": ["a", "b"]},
            cleanup=unset,
            writes=True,
        ),
        Case(
            "cluster_name.put.again",
            "PUT",
            cn,
            {"name": "compat-cluster"},
            setup=set_cn,
            cleanup=unset,
            writes=True,
        ),
        Case("cluster_name.put.then_get", "GET", cn, setup=set_cn, cleanup=unset, writes=True),
        Case(
            "cluster_name.put.then_global_parameter",
            "GET",
            name_param,
            setup=set_cn,
            cleanup=unset,
            writes=True,
        ),
        Case(
            "cluster_name.put.then_overview",
            "GET",
            "/api/overview",
            query={"columns": "cluster_name"},
            setup=set_cn,
            cleanup=unset,
            writes=True,
            stable=("cluster_name",),
        ),
        Case("cluster_name.delete", "DELETE", cn),
        Case("cluster_name.post", "POST", cn, {"name": "x"}),
    ]
    return cases


# --- what operators' scripts use beyond the generated cases -----------------------------

#: every basic property, by the API's names (RabbitMQ's), each of the right type
EVERY_PROPERTY = {
    "content_type": "text/plain",
    "content_encoding": "utf-8",
    "headers": {"i": 1, "s": "x", "f": 1.5, "b": True, "l": [1, "a"], "t": {"n": 1}},
    "delivery_mode": 2,
    "priority": 3,
    "correlation_id": "c1",
    "reply_to": "r1",
    "expiration": "60000",
    "message_id": "m1",
    "timestamp": 1700000000,
    "type": "t1",
    "user_id": "guest",
    "app_id": "a1",
    "cluster_id": "cl1",
}
#: a property of the wrong type for each (the API checks integers and strings)
BAD_PROPERTY = {
    name: ("x" if name in ("delivery_mode", "priority", "timestamp") else 5)
    for name in EVERY_PROPERTY
    if name != "headers"
}
#: a user made in a case's setup, removed after (runner.Target.teardown removes it too)
TMP_USER = "compat-tmp"


def _publish(queue: str, properties: dict[str, Any], payload: str = "x") -> Req:
    return Req(
        "POST",
        f"/api/exchanges/{V}/amq.default/publish",
        {
            "properties": properties,
            "routing_key": queue,
            "payload": payload,
            "payload_encoding": "string",
        },
    )


def exchange_parity() -> list[Case]:
    """What `{}` and string booleans declare; publishing with each basic property, by
    RabbitMQ's names, good and bad."""
    x = f"/api/exchanges/{V}"
    gone = [Req("DELETE", f"{x}/x-new")]
    cases = [
        Case(
            f"exchanges.put.{suffix}.then_get",
            "GET",
            f"{x}/x-new",
            setup=[Req("PUT", f"{x}/x-new", body)],
            cleanup=gone,
            writes=True,
        )
        for suffix, body in (
            ("empty_object", {}),
            ("string_booleans", {"durable": "true", "auto_delete": "true", "internal": "true"}),
            ("string_false", {"durable": "false"}),
            ("no_body", NOBODY),
        )
    ]
    cases.append(Case("exchanges.put.no_body", "PUT", f"{x}/x-new", cleanup=gone, writes=True))
    q = "q-pub"
    made = [Req("PUT", f"/api/queues/{V}/{q}", {})]
    unmade = [Req("DELETE", f"/api/queues/{V}/{q}")]

    def publish(suffix: str, properties: Any, user: str = "guest", where: str = "amq.default"):
        return Case(
            f"exchanges.publish.{suffix}",
            "POST",
            f"{x}/{where}/publish",
            {
                "properties": properties,
                "routing_key": q,
                "payload": "x",
                "payload_encoding": "string",
            },
            user,
            setup=list(made),
            cleanup=list(unmade),
            writes=True,
        )

    cases.append(publish("every_property", EVERY_PROPERTY))
    cases += [publish(f"property_{name}", {name: EVERY_PROPERTY[name]}) for name in EVERY_PROPERTY]
    cases += [
        publish(f"bad_property_{name}", {name: value}) for name, value in BAD_PROPERTY.items()
    ]
    cases += [
        publish("every_property.as_management", EVERY_PROPERTY, "compat-mgmt"),
        publish("every_property.as_readonly", EVERY_PROPERTY, "compat-readonly"),
        publish("every_property.missing_exchange", EVERY_PROPERTY, where="x-nope"),
        publish("pamqp_name_message_type", {"message_type": "t1"}),
        publish("priority_256", {"priority": 256}),
        publish("priority_negative", {"priority": -1}),
        publish("priority_float", {"priority": 1.5}),
        publish("timestamp_negative", {"timestamp": -1}),
        publish("timestamp_string", {"timestamp": "1700000000"}),
        publish("delivery_mode_0", {"delivery_mode": 0}),
        publish("delivery_mode_3", {"delivery_mode": 3}),
        publish("delivery_mode_string", {"delivery_mode": "2"}),
        publish("expiration_number", {"expiration": 60000}),
        publish("expiration_not_a_number", {"expiration": "abc"}),
        publish("expiration_negative", {"expiration": "-1"}),
        publish("expiration_fraction", {"expiration": "1.5"}),
        publish("expiration_empty", {"expiration": ""}),
        publish("user_id_other", {"user_id": "compat-mgmt"}),
        publish("user_id_other.as_management", {"user_id": "guest"}, "compat-mgmt"),
        publish("headers_null_value", {"headers": {"a": None}}),
        publish("headers_null_in_array", {"headers": {"a": [None]}}),
        publish("headers_array", {"headers": [1]}),
        publish("headers_string", {"headers": "x"}),
        publish("properties_null", None),
        publish("string_null", {"content_type": None}),
        publish("internal_exchange", {}, where="amq.rabbitmq.trace"),
        publish("cc_not_a_list", {"headers": {"CC": "q1"}}),
        publish("bcc_not_a_list", {"headers": {"BCC": 5}}),
        publish("direct_reply_to", {"reply_to": "amq.rabbitmq.reply-to"}),
    ]
    return cases


#: byte arrays (and one in a table, one in an array) a queue is declared with over AMQP:
#: UTF-8 or not, short, one base64 line exactly (57 bytes), more than one line
NOT_UTF8_ARGUMENTS: dict[str, Any] = {
    "x-bin": b"\x00\xff",
    "x-utf8": b"ab",
    "x-empty": b"",
    "x-one-line": b"\xff" * 57,
    "x-lines": b"\xfe" * 120,
    "x-table": {"t": b"\xff", "u": b"ok"},
    "x-array": [b"\xfe", "s"],
}


def queue_parity() -> list[Case]:
    """What `{}` and string booleans declare; the properties a get shows; access refused
    to a get (and in which order RabbitMQ checks the request)."""
    q = f"/api/queues/{V}"
    gone = [Req("DELETE", f"{q}/q-new")]
    cases = [
        Case(
            "queues.get.arguments_not_utf8",
            "GET",
            f"{q}/q-new",
            query={"columns": "name,arguments"},
            setup=[Req("AMQP_DECLARE", "q-new", NOT_UTF8_ARGUMENTS)],
            cleanup=gone,
            writes=True,
        ),
    ]
    cases += [
        Case(
            f"queues.put.{suffix}.then_get",
            "GET",
            f"{q}/q-new",
            query={"columns": "name,durable,auto_delete,exclusive,arguments,type"},
            setup=[Req("PUT", f"{q}/q-new", body)],
            cleanup=gone,
            writes=True,
        )
        for suffix, body in (
            ("empty_object", {}),
            ("string_booleans", {"durable": "true", "auto_delete": "true"}),
            ("string_false", {"durable": "false"}),
            ("no_body", NOBODY),
            ("exclusive_true", {"exclusive": True}),
        )
    ]
    cases += [
        Case(f"queues.put.{suffix}", "PUT", f"{q}/q-new", body, cleanup=gone, writes=True)
        for suffix, body in (
            ("exclusive_true", {"exclusive": True}),
            ("exclusive_string", {"exclusive": "true"}),
            ("exclusive_number", {"exclusive": 1}),
        )
    ]
    cases += body_cases(
        "queues.actions",
        "POST",
        f"{q}/q1/actions",
        {"action": "sync"},
        required=("action",),
        types={"action": "string"},
        missing_vhost="/api/queues/compat-nope/q1/actions",
        users=("compat-mgmt", "compat-noperm", "compat-notag"),
    )
    cases += [
        Case(
            "queues.actions.cancel_sync",
            "POST",
            f"{q}/q1/actions",
            {"action": "cancel_sync"},
            writes=True,
        ),
        Case("queues.actions.unknown", "POST", f"{q}/q1/actions", {"action": "nope"}, writes=True),
        Case(
            "queues.actions.missing", "POST", f"{q}/q-nope/actions", {"action": "sync"}, writes=True
        ),
        Case("queues.actions.get", "GET", f"{q}/q1/actions"),
    ]
    make = [Req("PUT", f"{q}/q-del", {"durable": False})]
    gone = [Req("DELETE", f"{q}/q-del")]
    take = {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"}

    def get(suffix: str, published: list[dict[str, Any]], body: Any = take, **kw: Any) -> Case:
        return Case(
            f"queues.get_messages.{suffix}",
            "POST",
            kw.pop("path", f"{q}/q-del/get"),
            body,
            kw.pop("user", "guest"),
            setup=[*make, *kw.pop("setup", []), *(_publish("q-del", p) for p in published)],
            cleanup=[*gone, *kw.pop("cleanup", [])],
            writes=True,
        )

    cases.append(get("every_property", [EVERY_PROPERTY]))
    cases += [get(f"property_{n}", [{n: v}]) for n, v in EVERY_PROPERTY.items()]
    cases += [
        get("empty_strings", [{"content_type": "", "app_id": "", "type": ""}]),
        get(
            "header_types",
            [{"headers": {"neg": -5, "big": 9999999999999, "e": [], "o": {}, "ll": [[1]]}}],
        ),
        get("headers_array", [{"headers": []}]),
        get("no_properties", [{}]),
        # a message whose expiration has passed (0 ms: at once) is not there to get
        get("expired", [{"expiration": "0"}]),
        # CC and BCC route copies (BCC is not shown); the copy in q-cc is gotten
        get(
            "cc_bcc",
            [{"headers": {"CC": ["q-cc"], "BCC": ["q-cc", "q-bcc"]}}],
            path=f"{q}/q-cc/get",
            setup=[Req("PUT", f"{q}/q-cc", {})],
            cleanup=[Req("DELETE", f"{q}/q-cc")],
        ),
        get(
            "bcc",
            [{"headers": {"BCC": ["q-cc"], "x": 1}}],
            path=f"{q}/q-cc/get",
            setup=[Req("PUT", f"{q}/q-cc", {})],
            cleanup=[Req("DELETE", f"{q}/q-cc")],
        ),
        get("cc_bcc.own_copy", [{"headers": {"CC": ["q-cc"], "BCC": ["q-bcc"]}}]),
    ]
    no_read = [
        Req("PUT", f"/api/users/{TMP_USER}", {"password": "compat-pw", "tags": "management"}),
        Req(
            "PUT",
            f"/api/permissions/{V}/{TMP_USER}",
            {"configure": ".*", "write": ".*", "read": ""},
        ),
    ]
    unmade = [Req("DELETE", f"/api/users/{TMP_USER}")]
    cases += [
        get("as_no_read", [{}], user=TMP_USER, setup=no_read, cleanup=unmade),
        get(
            "missing.as_no_read",
            [],
            user=TMP_USER,
            setup=no_read,
            cleanup=unmade,
            path=f"{q}/q-nope/get",
        ),
        get(
            "bad_encoding.as_no_read",
            [],
            {**take, "encoding": "utf-16"},
            user=TMP_USER,
            setup=no_read,
            cleanup=unmade,
        ),
    ]
    for suffix, method, path, body in (
        ("purge", "DELETE", f"{q}/q-del/contents", NOBODY),
        ("delete", "DELETE", f"{q}/q-del", NOBODY),
        ("declare", "PUT", f"{q}/q-del2", {}),
        ("bind", "POST", f"/api/bindings/{V}/e/x-direct/q/q-del", {"routing_key": "k"}),
        ("aliveness", "GET", f"/api/aliveness-test/{V}", NOBODY),
    ):
        cases.append(
            Case(
                f"queues.access.{suffix}.as_no_read",
                method,
                path,
                body,
                TMP_USER,
                setup=[*make, *no_read],
                cleanup=[*gone, Req("DELETE", f"{q}/q-del2"), *unmade],
                writes=True,
            )
        )
    nothing = [
        Req("PUT", f"/api/users/{TMP_USER}", {"password": "compat-pw", "tags": "management"}),
        Req("PUT", f"/api/permissions/{V}/{TMP_USER}", {"configure": "", "write": "", "read": ""}),
    ]
    for suffix, method, path, body in (
        ("get", "POST", f"{q}/q-del/get", take),
        (
            "publish",
            "POST",
            f"/api/exchanges/{V}/amq.default/publish",
            {
                "properties": {},
                "routing_key": "q-del",
                "payload": "x",
                "payload_encoding": "string",
            },
        ),
        ("purge", "DELETE", f"{q}/q-del/contents", NOBODY),
        ("delete", "DELETE", f"{q}/q-del", NOBODY),
        ("aliveness", "GET", f"/api/aliveness-test/{V}", NOBODY),
    ):
        cases.append(
            Case(
                f"queues.access.{suffix}.as_no_permission_patterns",
                method,
                path,
                body,
                TMP_USER,
                setup=[*make, *nothing],
                cleanup=[*gone, *unmade],
                writes=True,
            )
        )
    return cases


#: a routing key with characters each encoding writes differently: a space, a slash, a
#: percent sign, a plus and a tilde
ODD_KEY = "with space/and%+~"


def binding_keys() -> list[Case]:
    """A binding's properties_key (RabbitMQ form-encodes the routing key: a space is
    `+`), and the forms of it a GET or DELETE takes."""
    b = f"/api/bindings/{V}/e/x-keys/q/q1"
    bind = [Req("POST", b, {"routing_key": ODD_KEY})]
    # The properties_key as listed; in a URL its %7E is a `~` (the arguments' separator)
    # once the path is decoded, so only the Location header's form (encoded once more)
    # names this binding.
    rmq_form = "with+space%2Fand%25%2B%7E"
    location_form = "with%2Bspace%252Fand%2525%252B%257E"
    unbind = [Req("DELETE", f"{b}/{location_form}")]
    forms = {
        "rabbitmq_form": rmq_form,
        "location_form": location_form,
        "percent20_form": "with%20space%2Fand%25%2B%7E",
        "raw_tilde": "with+space%2Fand%25%2B~",
    }
    cases = [
        Case(
            "bindings_eq.post.odd_key",
            "POST",
            b,
            {"routing_key": ODD_KEY},
            cleanup=unbind,
            writes=True,
        ),
        Case("bindings_eq.get.odd_key", "GET", b, setup=bind, cleanup=unbind, writes=True),
        Case(
            "bindings_eq.post.key_with_space_only",
            "POST",
            b,
            {"routing_key": "a b"},
            cleanup=[Req("DELETE", f"{b}/a+b")],
            writes=True,
        ),
    ]
    for suffix, form in forms.items():
        cases.append(
            Case(
                f"binding_eq.get.odd_key.{suffix}",
                "GET",
                f"{b}/{form}",
                setup=bind,
                cleanup=unbind,
                writes=True,
            )
        )
        cases.append(
            Case(
                f"binding_eq.delete.odd_key.{suffix}",
                "DELETE",
                f"{b}/{form}",
                setup=bind,
                cleanup=unbind,
                writes=True,
            )
        )
    cases += [
        Case(
            "binding_eq.delete.odd_key.then_list",
            "GET",
            b,
            setup=[*bind, Req("DELETE", f"{b}/{location_form}")],
            writes=True,
        ),
        Case(
            "binding_eq.get.plus_and_space",
            "GET",
            f"{b}/a+b",
            setup=[Req("POST", b, {"routing_key": "a b"})],
            cleanup=[Req("DELETE", f"{b}/a%20b")],
            writes=True,
        ),
        Case(
            "binding_eq.get.plus_and_space.percent20_form",
            "GET",
            f"{b}/a%20b",
            setup=[Req("POST", b, {"routing_key": "a b"})],
            cleanup=[Req("DELETE", f"{b}/a+b")],
            writes=True,
        ),
        Case(
            "binding_eq.delete.plus_and_space.then_list",
            "GET",
            b,
            setup=[Req("POST", b, {"routing_key": "a b"}), Req("DELETE", f"{b}/a+b")],
            writes=True,
        ),
        Case("binding_eq.get.too_many_tokens", "GET", f"{b}/a~b~c", writes=True),
        Case("binding_eq.delete.too_many_tokens", "DELETE", f"{b}/a~b~c", writes=True),
        Case(
            "binding_eq.delete.odd_key.as_readonly",
            "DELETE",
            f"{b}/{rmq_form}",
            user="compat-readonly",
            setup=bind,
            cleanup=unbind,
            writes=True,
        ),
        Case(
            "binding_eq.get.tilde_only",
            "GET",
            f"/api/bindings/{V}/e/x-direct/q/q1/k1~",
            writes=True,
        ),
    ]
    # Each case on an exchange of its own: what a case leaves bound goes with it.
    x = f"/api/exchanges/{V}/x-keys"
    for case in cases:
        case.setup = [Req("PUT", x, {"type": "topic"}), *case.setup]
        case.cleanup = [*case.cleanup, Req("DELETE", x)]
    return cases


def users_without_password() -> list[Case]:
    """A user made or updated with neither password nor password_hash: RabbitMQ gives it
    no password it can log in with (a certificate-only user); an empty password never
    logs in."""
    u = "/api/users/compat-new"
    gone = [Req("DELETE", u)]
    bare = [Req("PUT", u, {"tags": "management"})]
    with_pw = [Req("PUT", u, {"password": "x", "tags": "management"})]
    cases = [
        Case("users.put.no_password", "PUT", u, {"tags": "management"}, cleanup=gone, writes=True),
        Case(
            "users.put.no_password.as_management",
            "PUT",
            u,
            {"tags": "management"},
            user="compat-mgmt",
            cleanup=gone,
            writes=True,
        ),
        Case("users.put.no_password.then_get", "GET", u, setup=bare, cleanup=gone, writes=True),
        Case(
            "users.put.no_password.then_login_empty",
            "GET",
            "/api/whoami",
            user="compat-new:",
            setup=bare,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.no_password.then_login",
            "GET",
            "/api/whoami",
            user="compat-new:compat-pw",
            setup=bare,
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.update_tags_only.then_login_old_password",
            "GET",
            "/api/whoami",
            user="compat-new:x",
            setup=[*with_pw, *bare],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.update_tags_only.then_get",
            "GET",
            u,
            setup=[*with_pw, Req("PUT", u, {"tags": "monitoring"})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.password_again.then_login",
            "GET",
            "/api/whoami",
            user="compat-new:y",
            setup=[*bare, Req("PUT", u, {"password": "y", "tags": "management"})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.empty_password",
            "PUT",
            u,
            {"password": "", "tags": "management"},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.empty_password.then_login",
            "GET",
            "/api/whoami",
            user="compat-new:",
            setup=[Req("PUT", u, {"password": "", "tags": "management"})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.administrator_flag",
            "PUT",
            u,
            {"password": "x", "administrator": "true"},
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.administrator_flag.then_get",
            "GET",
            u,
            setup=[Req("PUT", u, {"password": "x", "administrator": True})],
            cleanup=gone,
            writes=True,
        ),
        Case(
            "users.put.administrator_flag_bad",
            "PUT",
            u,
            {"password": "x", "administrator": "maybe"},
            cleanup=gone,
            writes=True,
        ),
    ]
    return cases


def node_healthcheck() -> list[Case]:
    """/api/healthchecks/node, which RabbitMQ 3.10 still serves for older probes."""
    h = "/api/healthchecks/node"
    cases = get("healthchecks.node", h, missing=f"{h}/rabbit@nowhere")
    cases += [
        Case("healthchecks.node.get.named", "GET", f"{h}/{{node}}"),
        Case("healthchecks.node.get.bad_password", "GET", h, user="guest:wrong"),
        Case("healthchecks.node.post", "POST", h, {}),
        Case("healthchecks.node.delete", "DELETE", f"{h}/{{node}}"),
    ]
    return cases


def methods() -> list[Case]:
    """A method a path does not take (405 with RabbitMQ's Allow) and OPTIONS (200 with
    Allow, credentials or not)."""
    q = f"/api/queues/{V}"
    cases = []
    for suffix, method, path in (
        ("options.overview", "OPTIONS", "/api/overview"),
        ("options.queue", "OPTIONS", f"{q}/q1"),
        ("options.queues", "OPTIONS", q),
        ("options.publish", "OPTIONS", f"/api/exchanges/{V}/x-direct/publish"),
        ("options.definitions", "OPTIONS", "/api/definitions"),
        ("options.bindings", "OPTIONS", f"/api/bindings/{V}/e/x-direct/q/q1"),
        ("options.binding", "OPTIONS", f"/api/bindings/{V}/e/x-direct/q/q1/k1"),
        ("options.unknown", "OPTIONS", "/api/no-such-thing"),
        ("options.bulk_delete", "OPTIONS", "/api/users/bulk-delete"),
        ("patch.queue", "PATCH", f"{q}/q1"),
        ("post.queue", "POST", f"{q}/q1"),
        ("put.queues", "PUT", q),
        ("get.publish", "GET", f"/api/exchanges/{V}/x-direct/publish"),
        ("get.get_messages", "GET", f"{q}/q1/get"),
        ("get.bulk_delete", "GET", "/api/users/bulk-delete"),
        ("put.bulk_delete", "PUT", "/api/users/bulk-delete"),
        ("delete.definitions", "DELETE", "/api/definitions"),
        ("put.vhost_definitions", "PUT", f"/api/definitions/{V}"),
        ("put.bindings", "PUT", f"/api/bindings/{V}/e/x-direct/q/q1"),
        ("put.binding", "PUT", f"/api/bindings/{V}/e/x-direct/q/q1/k1"),
        ("post.vhost", "POST", f"/api/vhosts/{V}"),
        ("post.user", "POST", "/api/users/compat-mgmt"),
        ("delete.connections", "DELETE", "/api/connections"),
        ("put.whoami", "PUT", "/api/whoami"),
        ("post.permission", "POST", f"/api/permissions/{V}/compat-mgmt"),
        ("post.policy", "POST", f"/api/policies/{V}/p1"),
        ("put.nodes", "PUT", "/api/nodes/{node}"),
        ("put.health", "PUT", "/api/health/checks/alarms"),
        ("post.aliveness", "POST", f"/api/aliveness-test/{V}"),
    ):
        cases.append(Case(f"methods.{suffix}", method, path))
    cases += [
        Case("methods.options.unauthenticated", "OPTIONS", "/api/overview", user="guest:wrong"),
        Case("methods.patch.unauthenticated", "PATCH", f"{q}/q1", user="guest:wrong"),
    ]
    return cases


def columns() -> list[Case]:
    """`columns` on single objects as on lists (RabbitMQ trims every GET answer unless
    `page` is given), dotted columns, and columns that match nothing."""
    q = f"/api/queues/{V}"

    def case(suffix: str, path: str, value: str, **kw: Any) -> Case:
        return Case(
            f"columns.{suffix}", "GET", path, query={"columns": value, **kw.pop("query", {})}, **kw
        )

    return [
        case("queue", f"{q}/q1", "name"),
        case("queue.two", f"{q}/q2", "name,messages"),
        case("queue.dotted", f"{q}/q2", "name,message_stats.publish"),
        case("queue.dotted_missing", f"{q}/q1", "name,message_stats.publish"),
        case("queue.nothing", f"{q}/q1", "nope"),
        case("queue.empty", f"{q}/q1", ""),
        case("queue.paged", f"{q}/q-args", "name", query={"page": "1"}),
        case("queues", q, "name"),
        case("queues.nothing", q, "nope"),
        case("queues.empty", q, ""),
        case("queues.commas", q, ",name,,"),
        case("queues.paged", q, "name", query={"page": "1"}),
        case("exchange", f"/api/exchanges/{V}/x-direct", "name,type"),
        case("exchanges", f"/api/exchanges/{V}", "name"),
        case("vhost", f"/api/vhosts/{V}", "name,tags"),
        case("vhost.nothing", f"/api/vhosts/{V}", "nope"),
        case("user", "/api/users/compat-mgmt", "name,tags"),
        case("permission", f"/api/permissions/{V}/compat-mgmt", "user"),
        case("overview", "/api/overview", "rabbitmq_version,management_version"),
        case("overview.nothing", "/api/overview", "nope"),
        case("overview.dotted", "/api/overview", "object_totals.nope"),
        case("whoami", "/api/whoami", "name"),
        case("node", "/api/nodes/{node}", "name,type,running"),
        case("binding", f"/api/bindings/{V}/e/x-direct/q/q1/k1", "routing_key"),
        case("bindings", f"/api/bindings/{V}/e/x-direct/q/q1", "routing_key"),
        case("policy", f"/api/policies/{V}/p1", "name,pattern"),
        case("definitions", f"/api/definitions/{V}", "queues.name", unordered=("queues",)),
        case("aliveness", f"/api/aliveness-test/{V}", "nope"),
        case("health", "/api/health/checks/alarms", "status"),
        case("missing", f"{q}/q-nope", "name"),
        case("as_no_tag", f"{q}/q1", "name", user="compat-notag"),
    ]


GROUPS = [
    overview,
    nodes,
    definitions,
    connections,
    channels,
    consumers,
    exchanges,
    queues,
    bindings,
    vhosts,
    users,
    permissions,
    topic_permissions,
    policies,
    vhost_limits,
    health,
    user_limits,
    parameters,
    shovels,
    federation_links,
    global_parameters,
    methods,
    columns,
]


def all_cases() -> list[Case]:
    cases = [case for group in GROUPS for case in group()]
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"case names used twice: {sorted(duplicates)}"
    return cases


__all__ = ["NOBODY", "all_cases"]
