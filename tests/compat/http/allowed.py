"""Deliberate differences of the management API from RabbitMQ 3.10.8, each with its
entry in docs/differences.md. (Differences not yet closed are in known_gaps.txt.)"""

from __future__ import annotations

import os

from ..common import Allowed

ALLOWED: list[Allowed] = [
    Allowed(
        case="*",
        kind="crash",
        path="",
        anchor="differences.md#http-crash",
        reason="where RabbitMQ crashes (500, no body) on bad input, Leveret answers 400 "
        "with an error body naming the problem; the replay checks it is a 4xx error body",
    ),
    Allowed(
        case="*",
        kind="value",
        path="*exchange_types",
        anchor="differences.md#plugins-exchange-types",
        reason="Leveret also lists its built-in x-deduplication and x-delayed-message exchange "
        "types",
    ),
    Allowed(
        case="user_connections.get.own",
        kind="status",
        path="",
        anchor="differences.md#http-own-connections",
        reason="RabbitMQ 3.10 crashes (500) when a user who is not an administrator lists "
        "connections by user name; Leveret answers with the user's own connections",
    ),
    Allowed(
        case="definitions.get",
        kind="extra",
        path="vhosts[].metadata",
        anchor="differences.md#http-definitions-vhost-metadata",
        reason="Leveret exports a vhost's description and tags (as RabbitMQ 3.11 does; "
        "3.10 imports them but drops them on export)",
    ),
    Allowed(
        case="*",
        kind="*",
        path="*ports",
        anchor="differences.md#http-clustering-listener",
        reason="RabbitMQ lists its Erlang distribution listener (clustering); Leveret has none",
    ),
    Allowed(
        case="health.protocol-listener.*",
        kind="value",
        path="protocols",
        anchor="differences.md#http-clustering-listener",
        reason="RabbitMQ lists its Erlang distribution listener (clustering); Leveret has none",
    ),
    Allowed(
        case="extensions.get",
        kind="value",
        path="",
        anchor="differences.md#http-extensions",
        reason="the JavaScript plug-ins of RabbitMQ's web UI; Leveret's UI has none",
    ),
    *(
        Allowed(
            case=case,
            kind=kind,
            path="reason",
            anchor="differences.md#http-erlang-terms",
            reason="RabbitMQ's reason is an Erlang term or crash report (a JSON array "
            "of character codes, a stack trace); Leveret names the problem in words",
        )
        for case, kind in (
            ("exchanges.put.wrong_type_type", "value"),
            ("permissions.put.bad_regex", "type"),
            ("users.put.bad_hash", "type"),
            ("definitions.vhost.post.queue_string_booleans", "value"),
            ("definitions.vhost.post.exchange_string_booleans", "value"),
            ("queues.put.exclusive_string", "value"),
            ("queues.put.exclusive_number", "value"),
        )
    ),
    Allowed(
        case="*policies.put.bad_apply_to",
        kind="value",
        path="reason",
        anchor="differences.md#http-policy-apply-to",
        reason="Leveret also takes RabbitMQ 3.12's apply-to values classic_queues and "
        "streams, and its text lists them",
    ),
    Allowed(
        case="*policies.put.bad_pattern",
        kind="value",
        path="reason",
        anchor="differences.md#http-regex",
        reason="the regular expression engines differ (PCRE, Python's re): the error "
        "inside RabbitMQ's text is Python's",
    ),
    Allowed(
        case="users.put.bad_algorithm",
        kind="*",
        path="",
        anchor="differences.md#http-hash-algorithm",
        reason="RabbitMQ creates a user with a hashing algorithm it does not know, who "
        "can then never log in; Leveret refuses it (400 naming the algorithm)",
    ),
    Allowed(
        case="parameters.put.bad_uri",
        kind="value",
        path="reason",
        anchor="differences.md#plugins-long-erlang-terms",
        reason="RabbitMQ wraps a long Erlang term over indented lines; Leveret writes the "
        "same term on one line",
    ),
    *(
        Allowed(
            case=case,
            kind="*",
            path="",
            anchor="differences.md#http-cluster-name-string",
            reason="RabbitMQ stores a cluster name that is not a string, and then resets "
            "every new AMQP connection; Leveret refuses it (400)",
        )
        for case in ("global_parameters.put.cluster_name_number", "cluster_name.put.name_list")
    ),
    Allowed(
        case="global_parameters.put.empty_object.then_get",
        kind="type",
        path="value",
        anchor="differences.md#http-global-parameter-empty-object",
        reason="RabbitMQ reads an empty object back as [] (an empty Erlang property list); "
        "Leveret keeps {}",
    ),
    *(
        Allowed(
            case=f"exchanges.publish.{case}",
            kind="*",
            path="*",
            anchor="differences.md#http-publish-property-range",
            reason="RabbitMQ keeps a property no AMQP field can hold (priority 256, a "
            "negative timestamp); Leveret refuses it (400 naming the property and its range)",
        )
        for case in ("priority_256", "priority_negative", "timestamp_negative")
    ),
    Allowed(
        case="columns.overview.dotted",
        kind="type",
        path="object_totals",
        anchor="differences.md#http-columns-nested",
        reason="RabbitMQ does not trim an object it holds as an Erlang map; Leveret trims "
        "every object alike",
    ),
    Allowed(
        case="definitions.import.permission_missing_vhost.then_get",
        kind="*",
        path="*",
        anchor="differences.md#http-definitions-missing-vhost-or-user",
        reason="RabbitMQ makes the file's user before it meets the permission in a missing "
        "vhost; Leveret refuses the import before it changes anything",
    ),
    Allowed(
        case="definitions.vhost.post.queue_without_flags*",
        kind="*",
        path="*",
        anchor="differences.md#http-definitions-missing-flags",
        reason="RabbitMQ crashes (400, function_clause) on a queue without durable and "
        "auto_delete in a definitions file; Leveret imports it (durable, not auto-delete)",
    ),
    Allowed(
        case="vhost_tracing.put.*true.then_get",
        kind="value",
        path="tracing",
        anchor="differences.md#http-trace-exchange",
        reason="Leveret has no firehose tracer: a vhost's tracing stays false",
    ),
]

if os.environ.get("LEVERET_TEST_WORKERS", "1") != "1":
    # Only a broker of several workers has the field (a one-process broker answers as
    # RabbitMQ, and this entry would be unused).
    ALLOWED.append(
        Allowed(
            case="*",
            kind="extra",
            path="*worker",
            anchor="differences.md#http-worker-field",
            reason="a broker of several workers names the worker of each queue and connection",
        )
    )
