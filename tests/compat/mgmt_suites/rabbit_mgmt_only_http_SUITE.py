"""rabbit_mgmt_only_http_SUITE (deps/rabbitmq_management/test, RabbitMQ v3.10.8) as
scenarios (see rabbit_mgmt_http_SUITE.py for how the suites are translated).

Most of this suite runs rabbit_mgmt_http_SUITE's tests again on a node started with
`disable_management_stats`; the reference broker keeps its statistics on, so those are
left out (`NOT_TRANSLATED`). Its own tests are here: `disable_stats=true` on a request,
and a double-encoded JSON body.
"""

from __future__ import annotations

from .rabbit_mgmt_http_SUITE import ALL, delete, get, put
from .scenario import Raw, Scenario, amqp, wait

V = "suite-v"
CONN = ("name", "user", "vhost", "state", "protocol", "node")

NOT_TRANSLATED = {
    name: "reruns rabbit_mgmt_http_SUITE's test on a node with management statistics off"
    for name in (
        "overview_test",
        "nodes_test",
        "vhosts_test",
        "connections_test",
        "exchanges_test",
        "queues_test",
        "quorum_queues_test",
        "queues_well_formed_json_test",
        "permissions_vhost_test",
        "permissions_connection_channel_consumer_test",
        "consumers_cq_test",
        "consumers_qq_test",
        "arguments_test",
        "queue_actions_test",
        "exclusive_queue_test",
        "connections_channels_pagination_test",
        "exchanges_pagination_test",
        "exchanges_pagination_permissions_test",
        "queue_pagination_test",
        "queue_pagination_columns_test",
        "queues_pagination_permissions_test",
        "samples_range_test",
        "sorting_test",
        "columns_test",
        "if_empty_unused_test",
    )
}
NOT_TRANSLATED.update(
    {
        "mirrored_queues_test": "classic mirrored queues across a cluster of nodes",
        "queues_enable_totals_test": "sets enable_queue_totals by Erlang RPC",
        "invalid_config_test": "starts a node with an invalid management configuration",
    }
)


def _no_stats(path: str, **query: str) -> list:
    """A listing with statistics, then the same with `disable_stats=true`: which fields
    each keeps (the values are statistics, compared as types only)."""
    volatile = (
        "message_stats",
        "*_details",
        "messages*",
        "recv_oct",
        "send_oct",
        "*_cnt",
        "reductions",
        "idle_since",
        "consumer_capacity",
        "memory",
    )
    return [
        get(path, query=dict(query), volatile=volatile),
        get(path, query={**query, "disable_stats": "true"}, volatile=volatile),
    ]


SCENARIOS: list[Scenario] = [
    Scenario(
        "double_encoded_json_test",
        [
            put(f"/vhosts/{V}"),
            put(f"/permissions/{V}/guest", ALL),
            put(
                f"/queues/{V}/suite-q",
                Raw(b'"{\\"auto_delete\\":false,\\"durable\\":true}"'),
            ),
            get(f"/queues/{V}/suite-q"),
            delete(f"/vhosts/{V}"),
        ],
        [delete(f"/vhosts/{V}")],
    ),
    Scenario(
        "disable_with_disable_stats_parameter_test",
        [
            put(f"/vhosts/{V}"),
            put(f"/permissions/{V}/guest", ALL),
            amqp("open", label="c", vhost=V),
            put(f"/queues/{V}/suite-test0", {}),
            amqp("publish", label="c", routing_key="suite-test0", body="message"),
            wait(f"/vhosts/{V}/channels", count=1),
            get(f"/vhosts/{V}/channels", record="status"),
            get(f"/vhosts/{V}/channels", query={"disable_stats": "true"}, record="status"),
            get(f"/vhosts/{V}/connections", query={"columns": ",".join(CONN)}),
            get(
                f"/vhosts/{V}/connections",
                query={"disable_stats": "true", "columns": ",".join(CONN)},
            ),
            amqp("close", label="c"),
            get(f"/exchanges/{V}/amq.direct", query={"disable_stats": "true"}),
            get("/nodes", query={"disable_stats": "true"}, record="status"),
            get("/overview", query={"disable_stats": "true"}, record="status"),
            *_no_stats(f"/queues/{V}", lengths_age="60", lengths_incr="1"),
            delete(f"/queues/{V}/suite-test0"),
            delete(f"/vhosts/{V}"),
        ],
        [delete(f"/vhosts/{V}")],
    ),
]
