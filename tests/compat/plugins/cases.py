"""The cases: definitions, validation, status and moved messages, as data.

A case is a list of steps run in order against one broker (RabbitMQ with its
shovel and federation plugins, or Leveret). Steps:

- `["http", METHOD, PATH, BODY]`: a management API call; recorded (status, shape,
  body) unless the step ends with `"quiet"`.
- `["publish", QUEUE_OR_EXCHANGE, ROUTING_KEY, BODY, PROPERTIES]`: one confirmed
  publish over AMQP (to the default exchange when the first field is "").
- `["get", QUEUE]`: wait (10 s at most) for one message and record it: its
  routing key, redelivered flag and every property, header values with their
  AMQP field types (`["S", "text"]`, `["l", 5]`, arrays and tables recursively).
- `["wait_shovel", VHOST, NAME, STATE]`, `["wait_link", STATUS]`: poll the
  status endpoint until the shovel (or every federation link) reaches the state.
- `["sleep", SECONDS]`.

Every case deletes what it made (RabbitMQ is shared between runs). URIs are
`amqp://` (this broker) so that recordings name no port.
"""

from __future__ import annotations

from typing import Any

P = "/api/parameters"
SHOVEL = f"{P}/shovel/%2F"


def shovel(**value: Any) -> dict[str, Any]:
    """A valid shovel value, with keys given as Python names (src_queue → src-queue)."""
    base = {
        "src-uri": "amqp://",
        "src-queue": "cq-src",
        "dest-uri": "amqp://",
        "dest-queue": "cq-dest",
    }
    for key, item in value.items():
        key = key.replace("_", "-")
        if item is None:
            base.pop(key, None)
        else:
            base[key] = item
    return base


def put(name: str, value: Any) -> list[Any]:
    return ["http", "PUT", f"{SHOVEL}/{name}", {"value": value}]


def cleanup_queues(*names: str) -> list[list[Any]]:
    return [["http", "DELETE", f"/api/queues/%2F/{n}", None, "quiet"] for n in names]


def invalid(name: str, value: Any) -> dict[str, Any]:
    return {
        "name": f"shovel.invalid.{name}",
        "about": f"a shovel definition RabbitMQ refuses ({name})",
        "steps": [
            put("cbad", value),
            ["http", "GET", f"{SHOVEL}/cbad", None],
            ["http", "DELETE", f"{SHOVEL}/cbad", None, "quiet"],
            *cleanup_queues("cq-src", "cq-dest"),
        ],
    }


CASES: list[dict[str, Any]] = [
    # --- parameters: the API --------------------------------------------------------
    {
        "name": "shovel.put_get_list_delete",
        "about": "PUT (201, then 204), GET one, list, DELETE (204, then 404)",
        "steps": [
            put("cs1", shovel()),
            put("cs1", shovel(src_prefetch_count=10)),
            ["http", "GET", f"{SHOVEL}/cs1", None],
            ["http", "GET", f"{P}/shovel", None],
            ["http", "GET", f"{P}/shovel/%2F", None],
            ["http", "DELETE", f"{SHOVEL}/cs1", None],
            ["http", "DELETE", f"{SHOVEL}/cs1", None],
            ["http", "GET", f"{SHOVEL}/cs1", None],
            ["http", "GET", f"{P}/shovel", None],
            *cleanup_queues("cq-src", "cq-dest"),
        ],
    },
    {
        "name": "parameters.vhost_limits",
        "about": "vhost limits are the component vhost-limits, name limits",
        "steps": [
            ["http", "PUT", f"{P}/vhost-limits/%2F/limits", {"value": {"max-queues": 500}}],
            ["http", "GET", f"{P}/vhost-limits/%2F/limits", None],
            ["http", "GET", f"{P}/vhost-limits", None],
            ["http", "GET", "/api/vhost-limits/%2F", None],
            ["http", "DELETE", f"{P}/vhost-limits/%2F/limits", None],
            ["http", "GET", f"{P}/vhost-limits", None],
        ],
    },
    {
        "name": "parameters.errors",
        "about": "an unknown component, no value key, an unknown vhost, missing objects",
        "steps": [
            ["http", "PUT", f"{P}/nocomponent/%2F/x", {"value": {}}],
            ["http", "PUT", f"{SHOVEL}/x", {"nope": 1}],
            ["http", "PUT", f"{P}/shovel/novhost/x", {"value": shovel()}],
            ["http", "GET", f"{SHOVEL}/missing", None],
            ["http", "DELETE", f"{SHOVEL}/missing", None],
            ["http", "GET", f"{P}/shovel/novhost", None],
            ["http", "DELETE", "/api/shovels/vhost/%2F/missing/restart", None],
            ["http", "DELETE", "/api/shovels/vhost/%2F/missing", None],
            ["http", "GET", "/api/shovels/novhost", None],
            ["http", "GET", "/api/federation-links/novhost", None],
        ],
    },
    # --- shovel validation: RabbitMQ's reasons ------------------------------------------
    invalid("missing_src_uri", shovel(src_uri=None)),
    invalid("missing_dest_uri", shovel(dest_uri=None)),
    invalid("bad_scheme", shovel(src_uri="http://x")),
    invalid("no_scheme", shovel(dest_uri="notauri")),
    invalid("port_requires_host", shovel(src_uri="amqp://:5672")),
    invalid("port_out_of_range", shovel(src_uri="amqp://h:99999")),
    invalid("vhost_with_slash", shovel(src_uri="amqp://h/a/b")),
    invalid("bad_escape", shovel(src_uri="amqp://h/%zz")),
    invalid("heartbeat_not_integer", shovel(src_uri="amqp://h?heartbeat=x")),
    invalid("uri_not_text", shovel(src_uri=5)),
    invalid("bad_uri_in_list", shovel(src_uri=["amqp://", "ftp://y"])),
    invalid("direct_vhost_missing", shovel(src_uri="amqp:///no-such-vhost")),
    invalid("queue_and_exchange", shovel(src_exchange="x")),
    invalid("no_source", shovel(src_queue=None)),
    invalid("dest_queue_and_exchange", shovel(dest_exchange="x")),
    invalid("unknown_ack_mode", shovel(ack_mode="sometimes")),
    invalid("prefetch_not_number", shovel(src_prefetch_count="ten")),
    invalid("reconnect_delay_not_number", shovel(reconnect_delay="soon")),
    invalid("delete_after_word", shovel(src_delete_after="later")),
    invalid("delete_after_negative", shovel(src_delete_after=-1)),
    invalid("delete_after_no_ack", shovel(src_delete_after=5, ack_mode="no-ack")),
    invalid("unknown_keys", shovel(bogus=1, other="x")),
    invalid("not_boolean", shovel(dest_add_forward_headers="yes")),
    invalid("queue_not_text", shovel(src_queue=7)),
    invalid(
        "several_problems",
        shovel(
            src_exchange_key=5,
            src_delete_after=1.5,
            src_prefetch_count=True,
            dest_add_timestamp_header=None,
        ),
    ),
    invalid("publish_property_type", shovel(dest_publish_properties={"delivery_mode": "x"})),
    invalid("publish_property_unknown", shovel(dest_publish_properties={"foo": "x"})),
    invalid("value_not_object", "text"),
    invalid("negative_prefetch", shovel(src_prefetch_count=-3)),
    # --- federation parameters and policies ------------------------------------------------
    {
        "name": "federation.parameters",
        "about": "upstreams and sets: valid ones listed, bad ones refused with reasons",
        "steps": [
            [
                "http",
                "PUT",
                f"{P}/federation-upstream/%2F/cu1",
                {"value": {"uri": "amqp://", "max-hops": 2}},
            ],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream-set/%2F/cset",
                {"value": [{"upstream": "cu1", "exchange": "e"}]},
            ],
            ["http", "GET", f"{P}/federation-upstream", None],
            ["http", "GET", f"{P}/federation-upstream-set/%2F", None],
            ["http", "PUT", f"{P}/federation-upstream/%2F/cbad", {"value": {}}],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream/%2F/cbad",
                {
                    "value": {
                        "uri": "amqp://",
                        "max-hops": "x",
                        "ack-mode": "no",
                        "trust-user-id": 1,
                        "exchange": 3,
                        "expires": "z",
                        "message-ttl": [],
                        "prefetch-count": "p",
                        "reconnect-delay": "r",
                        "queue": 1,
                        "zz": 1,
                    }
                },
            ],
            ["http", "PUT", f"{P}/federation-upstream/%2F/cbad", {"value": {"uri": "http://x"}}],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream-set/%2F/cbad",
                {"value": [{"upstream": "a"}, {"x": 1}]},
            ],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream-set/%2F/cbad",
                {"value": [{"upstream": "a", "max-hops": "n"}]},
            ],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream-set/%2F/cbad",
                {"value": [{"upstream": "a", "uri": "amqp://"}]},
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cpol",
                {"pattern": "^zz", "definition": {"federation-upstream-set": 1}},
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cpol",
                {
                    "pattern": "^zz",
                    "definition": {"federation-upstream-set": "all", "federation-upstream": "x"},
                },
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cpol",
                {"pattern": "^zz", "definition": {"federation-upstream": 2}},
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cpol",
                {"pattern": "^zz", "definition": {"federation-upstream": "cu1"}},
            ],
            ["http", "GET", "/api/policies/%2F/cpol", None],
            ["http", "DELETE", "/api/policies/%2F/cpol", None],
            ["http", "DELETE", f"{P}/federation-upstream-set/%2F/cset", None],
            ["http", "DELETE", f"{P}/federation-upstream/%2F/cu1", None],
        ],
    },
    # --- shovel status ---------------------------------------------------------------------
    {
        "name": "shovel.status.queue_to_queue",
        "about": "a running shovel's status, listed three ways; restart",
        "steps": [
            put("cst", shovel(src_queue="cst-a", dest_queue="cst-b")),
            ["wait_shovel", "/", "cst", "running"],
            ["http", "GET", "/api/shovels", None],
            ["http", "GET", "/api/shovels/%2F", None],
            ["http", "GET", "/api/shovels/vhost/%2F/cst", None],
            ["http", "GET", "/api/queues/%2F/cst-a", None],
            ["http", "DELETE", "/api/shovels/vhost/%2F/cst/restart", None],
            ["wait_shovel", "/", "cst", "running"],
            ["http", "DELETE", "/api/shovels/vhost/%2F/cst", None],
            ["sleep", 0.5],
            ["http", "GET", "/api/shovels", None],
            ["http", "GET", f"{SHOVEL}/cst", None],
            *cleanup_queues("cst-a", "cst-b"),
        ],
    },
    {
        "name": "shovel.status.exchange_to_exchange",
        "about": "an exchange source (src-exchange-key) and an exchange destination",
        "steps": [
            put(
                "cse",
                shovel(
                    src_queue=None,
                    src_exchange="amq.direct",
                    src_exchange_key="ck",
                    dest_queue=None,
                    dest_exchange="amq.topic",
                    dest_exchange_key="cd.k",
                ),
            ),
            ["wait_shovel", "/", "cse", "running"],
            ["http", "GET", "/api/shovels/%2F", None],
            ["http", "DELETE", f"{SHOVEL}/cse", None],
        ],
    },
    {
        "name": "shovel.status.unreachable",
        "about": "a destination nobody listens on: listed, retried",
        "steps": [
            put(
                "csu",
                shovel(
                    src_queue="csu-a", dest_uri="amqp://guest:guest@127.0.0.1:1", reconnect_delay=1
                ),
            ),
            ["sleep", 2.5],
            ["http", "GET", "/api/shovels/%2F", None],
            ["http", "DELETE", f"{SHOVEL}/csu", None],
            *cleanup_queues("csu-a"),
        ],
    },
    {
        "name": "shovel.delete_after",
        "about": "src-delete-after queue-length: moves what was there, then deletes itself",
        "steps": [
            ["http", "PUT", "/api/queues/%2F/cda-a", {"durable": True}, "quiet"],
            ["publish", "", "cda-a", "one", {}],
            ["publish", "", "cda-a", "two", {}],
            put(
                "cda",
                shovel(src_queue="cda-a", dest_queue="cda-b", src_delete_after="queue-length"),
            ),
            ["sleep", 2],
            ["http", "GET", f"{SHOVEL}/cda", None],
            ["http", "GET", "/api/shovels/%2F", None],
            ["get", "cda-b"],
            ["get", "cda-b"],
            *cleanup_queues("cda-a", "cda-b"),
        ],
    },
    # --- what a shovel does to messages --------------------------------------------------------
    {
        "name": "shovel.message.headers_and_properties",
        "about": "x-shovelled, x-shovelled-timestamp and dest-publish-properties",
        "steps": [
            put(
                "csm",
                shovel(
                    src_queue="csm-a",
                    dest_queue="csm-b",
                    dest_add_forward_headers=True,
                    dest_add_timestamp_header=True,
                    dest_publish_properties={"app_id": "shv", "delivery_mode": 2},
                ),
            ),
            ["wait_shovel", "/", "csm", "running"],
            [
                "publish",
                "",
                "csm-a",
                "first",
                {
                    "headers": {"a": 1, "z": "last"},
                    "message_id": "m1",
                    "correlation_id": "c1",
                    "priority": 3,
                },
            ],
            [
                "publish",
                "",
                "csm-a",
                "second",
                {"headers": {"x-shovelled": "junk"}, "user_id": "guest"},
            ],
            ["get", "csm-b"],
            ["get", "csm-b"],
            ["http", "DELETE", f"{SHOVEL}/csm", None],
            *cleanup_queues("csm-a", "csm-b"),
        ],
    },
    {
        "name": "shovel.message.unchanged",
        "about": "without header options a message arrives as it was published",
        "steps": [
            put("csp", shovel(src_queue="csp-a", dest_queue="csp-b")),
            ["wait_shovel", "/", "csp", "running"],
            [
                "publish",
                "",
                "csp-a",
                "plain",
                {
                    "headers": {"n": 1, "s": "t", "f": 1.5, "b": True},
                    "content_type": "text/plain",
                    "expiration": "60000",
                    "timestamp": 1700000000,
                    "type": "t",
                    "app_id": "a",
                    "delivery_mode": 2,
                    "reply_to": "r",
                },
            ],
            ["get", "csp-b"],
            ["http", "DELETE", f"{SHOVEL}/csp", None],
            *cleanup_queues("csp-a", "csp-b"),
        ],
    },
    # --- federation: status, upstream resources, messages -------------------------------------
    {
        "name": "federation.exchange",
        "about": "a federated exchange following an exchange of the same broker",
        "steps": [
            ["http", "PUT", "/api/exchanges/%2F/cfx", {"type": "topic", "durable": True}, "quiet"],
            ["http", "PUT", "/api/exchanges/%2F/cux", {"type": "topic", "durable": True}, "quiet"],
            ["http", "PUT", "/api/queues/%2F/cfx-q", {"durable": True}, "quiet"],
            ["http", "POST", "/api/bindings/%2F/e/cfx/q/cfx-q", {"routing_key": "k.#"}, "quiet"],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream/%2F/cfu",
                {
                    "value": {
                        "uri": "amqp://",
                        "exchange": "cux",
                        "max-hops": 2,
                        "expires": 600000,
                        "message-ttl": 60000,
                    }
                },
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cfp",
                {
                    "pattern": "^cfx$",
                    "apply-to": "exchanges",
                    "definition": {"federation-upstream-set": "all"},
                },
            ],
            ["wait_link", "running"],
            ["http", "GET", "/api/federation-links", None],
            ["http", "GET", "/api/federation-links/%2F", None],
            ["http", "GET", "/api/federation-links/state/down", None],
            ["http", "GET", "/api/exchanges/%2F/cux/bindings/source", None],
            ["http", "GET", "/api/queues/%2F/federation%3A%20cux%20-%3E%20{cluster}%3Acfx", None],
            ["publish", "cux", "k.1", "federated", {"headers": {"h": 1}, "user_id": "guest"}],
            ["get", "cfx-q"],
            ["http", "DELETE", "/api/policies/%2F/cfp", None],
            ["sleep", 1],
            ["http", "GET", "/api/federation-links", None],
            ["http", "GET", "/api/queues/%2F/federation%3A%20cux%20-%3E%20{cluster}%3Acfx", None],
            ["http", "DELETE", f"{P}/federation-upstream/%2F/cfu", None],
            ["http", "DELETE", "/api/exchanges/%2F/cfx", None, "quiet"],
            ["http", "DELETE", "/api/exchanges/%2F/cux", None, "quiet"],
            *cleanup_queues("cfx-q"),
        ],
    },
    {
        "name": "federation.queue",
        "about": "a federated queue fetching from a queue of the same broker for its consumer",
        "steps": [
            ["http", "PUT", "/api/queues/%2F/cuq", {"durable": True}, "quiet"],
            ["publish", "", "cuq", "from upstream", {"headers": {"CC": ["other"]}}],
            [
                "http",
                "PUT",
                f"{P}/federation-upstream/%2F/cqu",
                {"value": {"uri": "amqp://", "queue": "cuq"}},
            ],
            [
                "http",
                "PUT",
                "/api/policies/%2F/cqp",
                {
                    "pattern": "^cfq$",
                    "apply-to": "queues",
                    "definition": {"federation-upstream": "cqu"},
                },
            ],
            ["http", "PUT", "/api/queues/%2F/cfq", {"durable": True}, "quiet"],
            ["wait_link", "running"],
            ["http", "GET", "/api/federation-links/%2F", None],
            ["get", "cfq"],
            ["http", "DELETE", "/api/policies/%2F/cqp", None],
            ["http", "DELETE", f"{P}/federation-upstream/%2F/cqu", None],
            *cleanup_queues("cuq", "cfq"),
        ],
    },
]
