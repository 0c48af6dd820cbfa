"""Runs the HTTP table (cases.py) against one broker and makes each case's record.

The same code runs against RabbitMQ (record.py) and Leveret (the replay test), with
a plain HTTP client (http.client: any method, any body, paths sent as written) and
pika for the AMQP state (a named connection, a consumer, published messages).

Order matters and is the same on both brokers: `prepare` builds the shared state,
`settle` waits until RabbitMQ's statistics show it (they lag up to 5 s), then the
read-only cases run, then the cases that change something (each on objects of its
own, made in its `setup` and removed in its `cleanup`).
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pika

from ..common import EMPTY, masked, named_keys, shape, sorted_lists

VHOST = "compat"
PASSWORD = "compat-pw"
#: user -> (tags, permissions in VHOST or None)
USERS: dict[str, tuple[str, tuple[str, str, str] | None]] = {
    "compat-mgmt": ("management", (".*", ".*", ".*")),
    "compat-monitor": ("monitoring", (".*", ".*", ".*")),
    "compat-policy": ("policymaker", (".*", ".*", ".*")),
    "compat-notag": ("", (".*", ".*", ".*")),
    "compat-noperm": ("management", None),
    "compat-readonly": ("management", ("^$", "^$", ".*")),
}
NOBODY = object()


@dataclass
class Raw:
    """A body sent as these bytes, not as JSON (for the not-JSON cases)."""

    data: bytes


@dataclass
class Req:
    method: str
    path: str
    body: Any = NOBODY
    user: str = "guest"


@dataclass
class Case:
    name: str
    method: str
    path: str
    body: Any = NOBODY
    user: str = "guest"
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    setup: list[Req] = field(default_factory=list)
    cleanup: list[Req] = field(default_factory=list)
    volatile: tuple[str, ...] = ()
    #: names of VOLATILE compared by value in this case (a cluster name it set itself)
    stable: tuple[str, ...] = ()
    #: arrays (names or paths) compared in a canonical order, besides UNORDERED
    unordered: tuple[str, ...] = ()
    #: the read-only cases run first, on the shared state
    writes: bool = False

    def request(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "path": self.path, "user": self.user}
        if self.query:
            out["query"] = self.query
        if isinstance(self.body, Raw):
            out["body"] = {"$raw": self.body.data.decode("latin-1")}
        elif self.body is not NOBODY:
            out["body"] = self.body
        return out


#: values that differ between two runs of the same broker (masked; their type still counts)
VOLATILE = (
    "rate",
    "uptime",
    "mem_used",
    "mem_limit",
    "mem_calculation_strategy",
    "disk_free",
    "disk_free_limit",
    "fd_used",
    "fd_total",
    "sockets_used",
    "sockets_total",
    "proc_used",
    "proc_total",
    "run_queue",
    "processors",
    "os_pid",
    "connected_at",
    "idle_since",
    "memory",
    "reductions",
    "garbage_collection",
    "peer_port",
    "recv_oct",
    "send_oct",
    "recv_cnt",
    "send_cnt",
    "send_pend",
    "statistics_db_event_queue",
    "erlang_version",
    "erlang_full_version",
    "product_version",
    "product_name",
    "cluster_name",
    "listeners",
    "contexts",
    "applications",
    "exchange_types[].description",
    "*.exchange_types[].description",
    "auth_mechanisms",
    "enabled_plugins",
    "config_files",
    "log_files",
    "db_dir",
    "client_properties",
    "password_hash",
    "global_parameters",
    "port",
    "sample_retention_policies",
    "reductions_details",
    "consumer_utilisation",
    "metrics_gc_queue_length",
    "cluster_links",
    "net_ticktime",
    "io_*",
    "mnesia_*",
    "msg_store_*",
    "queue_index_*",
    "gc_*",
    "churn_rates",
    "backing_queue_status",
    "*_created",
    "*_closed",
    "*_declared",
    "*_deleted",
    "context_switches*",
    "ra_open_file_metrics",
)

#: arrays whose order RabbitMQ takes from a hash table: compared in a canonical order
UNORDERED = ("exchange_types", "*.exchange_types")


class Target:
    """One broker: its HTTP base URL (http://host:port) and AMQP URL."""

    def __init__(self, management: str, amqp_url: str) -> None:
        parts = urlsplit(management)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 15672
        self.amqp_url = amqp_url
        self.variables: dict[str, Any] = {}
        self._amqp: pika.BlockingConnection | None = None
        self._extra: list[pika.BlockingConnection] = []

    # --- HTTP ---------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        body: Any = NOBODY,
        user: str = "guest",
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        # "user:password" names the password ("user:" an empty one); else the user's own
        user, given, password = user.partition(":")
        if not given:
            password = "guest" if user == "guest" else PASSWORD
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        all_headers = {"Authorization": f"Basic {token}", **(headers or {})}
        data = None
        if isinstance(body, Raw):
            data = body.data
        elif body is not NOBODY:
            data = json.dumps(body).encode()
        if data is not None:
            all_headers.setdefault("Content-Type", "application/json")
        target = self.expand(path) + (f"?{urlencode(query)}" if query else "")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, target, body=data, headers=all_headers)
            response = conn.getresponse()
            text = response.read()
            lower = {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()
        if not text:
            return response.status, NOBODY, lower
        try:
            return response.status, json.loads(text), lower
        except ValueError:
            return response.status, {"$text": text.decode("utf-8", "replace")}, lower

    def expand(self, path: str) -> str:
        """{conn}, {channel}, ... in a path: this run's names, URL-quoted."""
        for name, value in self.variables.items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        return path

    def ok(self, method: str, path: str, body: Any = NOBODY) -> Any:
        status, answer, _ = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    # --- the shared state ---------------------------------------------------------

    def prepare(self) -> None:
        """Users, the vhost and its objects, and an AMQP connection with a consumer."""
        self.teardown()
        v = VHOST
        self.ok("PUT", f"/api/vhosts/{v}", {"description": "compat vhost", "tags": "a,b"})
        self.ok(
            "PUT", f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
        )
        for user, (tags, perms) in USERS.items():
            self.ok("PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": tags})
            if perms is not None:
                c, w, r = perms
                self.ok(
                    "PUT", f"/api/permissions/{v}/{user}", {"configure": c, "write": w, "read": r}
                )
        self.ok(
            "PUT",
            f"/api/topic-permissions/{v}/compat-mgmt",
            {"exchange": "x-topic", "write": "^a", "read": ".*"},
        )
        for q, body in {
            "q1": {"durable": True},
            "q2": {"durable": True},
            "q-args": {"durable": True, "arguments": {"x-max-length": 10}},
            "q-consumed": {"durable": False, "auto_delete": False},
        }.items():
            self.ok("PUT", f"/api/queues/{v}/{q}", body)
        for x, kind in {
            "x-direct": "direct",
            "x-topic": "topic",
            "x-fanout": "fanout",
            "x-headers": "headers",
        }.items():
            self.ok("PUT", f"/api/exchanges/{v}/{x}", {"type": kind, "durable": True})
        for source, kind, dest, body in (
            ("x-direct", "q", "q1", {"routing_key": "k1"}),
            ("x-topic", "q", "q2", {"routing_key": "a.#"}),
            ("x-direct", "e", "x-fanout", {"routing_key": "k2"}),
            (
                "x-headers",
                "q",
                "q1",
                {"routing_key": "", "arguments": {"x-match": "all", "h": "v"}},
            ),
        ):
            self.ok("POST", f"/api/bindings/{v}/e/{source}/{kind}/{dest}", body)
        self.ok(
            "PUT",
            f"/api/policies/{v}/p1",
            {"pattern": "^q-args$", "definition": {"max-length": 100}, "apply-to": "queues"},
        )
        self.ok(
            "PUT",
            f"/api/operator-policies/{v}/op1",
            {"pattern": "^q1$", "definition": {"max-length": 1000}, "apply-to": "queues"},
        )
        self.ok("PUT", f"/api/vhost-limits/{v}/max-queues", {"value": 1000})
        self.ok("PUT", "/api/user-limits/compat-mgmt/max-connections", {"value": 100})
        self.ok(
            "PUT",
            f"/api/parameters/federation-upstream/{v}/up1",
            {"value": {"uri": "amqp://localhost:5999", "expires": 3600000}},
        )
        # AMQP: a named connection, a consumer on q-consumed, 3 messages in q2.
        params = pika.URLParameters(self.amqp_url.rsplit("/", 1)[0] + "/" + v)
        params.client_properties = {"connection_name": "compat-conn"}
        params.heartbeat = 0
        self._amqp = pika.BlockingConnection(params)
        ch = self._amqp.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume("q-consumed", lambda *a: None, consumer_tag="compat-ctag")
        ch2 = self._amqp.channel()
        ch2.confirm_delivery()
        # Exchanges with traffic in the cases that write get it here too: RabbitMQ keeps
        # an exchange's statistics for a while after its vhost is deleted.
        ch2.basic_publish("x-direct", "k1", b"to q1")
        ch2.basic_publish("", "q-args", b"to q-args")
        for i in range(3):
            ch2.basic_publish(
                "x-topic",
                "a.b",
                f"message {i}".encode(),
                pika.BasicProperties(content_type="text/plain", delivery_mode=2),
            )

    def settle(self, timeout: float = 40.0) -> None:
        """Wait until the statistics show the state (RabbitMQ emits them every 5 s), and
        learn this run's names: node, connection, channels."""
        deadline = time.monotonic() + timeout
        while True:
            queues = self.ok("GET", f"/api/queues/{VHOST}")
            conns = [c for c in self.ok("GET", "/api/connections") if c.get("vhost") == VHOST]
            channels = [c for c in self.ok("GET", "/api/channels") if c.get("vhost") == VHOST]
            exchanges = [
                self.ok("GET", f"/api/exchanges/{VHOST}/{x}")
                for x in ("x-topic", "x-direct", "amq.default")
            ]
            ready = (
                all("messages" in q and "message_stats" in q for q in queues if q["name"] == "q2")
                and all("messages" in q for q in queues)
                and conns
                and "channels" in conns[0]
                and conns[0].get("channels") == 2
                and len(channels) == 2
                and all("consumer_count" in c for c in channels)
                and all("message_stats" in x for x in exchanges)
                and "message_stats" in self.ok("GET", f"/api/vhosts/{VHOST}")
            )
            if ready:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("statistics did not show the prepared state")
            time.sleep(0.5)
        time.sleep(1)
        overview = self.ok("GET", "/api/overview")
        self.variables = {
            "node": overview["node"],
            "conn": conns[0]["name"],
            "channel1": sorted(c["name"] for c in channels)[0],
            "channel2": sorted(c["name"] for c in channels)[1],
            "amqp_port": urlsplit(self.amqp_url).port,
            "http_port": self.port,
        }
        # made at the broker's first start (global parameters show it as it is)
        cluster_id = self.ok("GET", "/api/global-parameters/internal_cluster_id")["value"]
        self.variables["cluster_id"] = cluster_id
        headers = [b for b in self.ok("GET", f"/api/bindings/{VHOST}/e/x-headers/q/q1")]
        self.variables["props_args"] = headers[0]["properties_key"]

    def teardown(self) -> None:
        for extra in self._extra:
            try:
                extra.close()
            except Exception:  # closed by the case under test
                pass
        self._extra.clear()
        if self._amqp is not None:
            try:
                self._amqp.close()
            except Exception:  # already closed by a case
                pass
            self._amqp = None
        self.call("DELETE", f"/api/vhosts/{VHOST}")
        for vhost in ("compat-new", "compat-tmp"):
            self.call("DELETE", f"/api/vhosts/{vhost}")
        for user in [*USERS, "compat-new", "compat-tmp", "compat-bulk1", "compat-bulk2"]:
            self.call("DELETE", f"/api/users/{user}")

    # --- cases --------------------------------------------------------------------

    def open_connection(self, user: str) -> None:
        """An AMQP connection of `user` to VHOST; its name becomes the variable
        `conn_<user>` once the API lists it."""
        base = self.amqp_url.split("@", 1)[1].rsplit("/", 1)[0]
        password = "guest" if user == "guest" else PASSWORD
        params = pika.URLParameters(f"amqp://{user}:{password}@{base}/{VHOST}")
        params.heartbeat = 0
        self._extra.append(pika.BlockingConnection(params))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = self.ok("GET", f"/api/connections/username/{user}")
            # RabbitMQ's statistics show a connection up to 5 s after it opened, and
            # GET/DELETE /api/connections/{name} answer 404 until then.
            if (
                found
                and self.call("GET", "/api/connections/" + quote(found[0]["name"], safe=""))[0]
                == 200
            ):
                self.variables[f"conn_{user}"] = found[0]["name"]
                return
            time.sleep(0.2)
        raise RuntimeError(f"the connection of {user} is not listed")

    def declare_queue(self, name: str, arguments: dict[str, Any]) -> None:
        """Queue `name` in VHOST declared over AMQP, for arguments JSON cannot give
        (pika sends `bytes` as a byte array, 'x')."""
        base = self.amqp_url.split("@", 1)[1].rsplit("/", 1)[0]
        params = pika.URLParameters(f"amqp://guest:guest@{base}/{VHOST}")
        params.heartbeat = 0
        with pika.BlockingConnection(params) as conn:
            conn.channel().queue_declare(name, arguments=arguments)

    def wait_for(self, path: str, want: Any, timeout: float = 30.0) -> None:
        """Poll GET `path` until its list has items and each has `want`'s values (with
        `$count`: at least that many of them have): a shovel that runs, connections
        that RabbitMQ's statistics list (they lag up to 5 s)."""
        want = dict(want)
        count = want.pop("$count", None)
        deadline = time.monotonic() + timeout
        while True:
            status, found, _ = self.call("GET", path)
            if status == 200 and isinstance(found, list) and found:
                matching = [i for i in found if all(i.get(k) == v for k, v in want.items())]
                if len(matching) == len(found) if count is None else len(matching) >= count:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not show {want} ({count}): {found}")
            time.sleep(0.25)

    def run(self, case: Case) -> dict[str, Any]:
        for req in case.setup:
            if req.method == "AMQP":
                self.open_connection(req.user)
            elif req.method == "AMQP_DECLARE":
                self.declare_queue(req.path, req.body)
            elif req.method == "WAIT":
                self.wait_for(req.path, req.body)
            else:
                self.call(req.method, req.path, req.body, req.user)
        status, body, headers = self.call(
            case.method, case.path, case.body, case.user, case.query, case.headers
        )
        for req in case.cleanup:
            self.call(req.method, req.path, req.body, req.user)
        record: dict[str, Any] = {"request": case.request(), "status": status}
        if body is NOBODY:
            record["shape"] = EMPTY
        else:
            body = named_keys(body, self.variables)
            record["shape"] = shape(body)
            volatile = tuple(v for v in VOLATILE if v not in case.stable) + case.volatile
            body = masked(body, volatile, self.variables)
            record["body"] = sorted_lists(body, UNORDERED + case.unordered)
        if "location" in headers:
            record["location"] = masked(headers["location"], (), self.variables)
        if "allow" in headers:  # a 405's methods, and OPTIONS's answer
            record["allow"] = headers["allow"]
        return record


def run_all(target: Target, cases: list[Case]) -> dict[str, dict[str, Any]]:
    """Every case's record, read-only cases first; the state is removed at the end."""
    target.prepare()
    try:
        target.settle()
        ordered = [c for c in cases if not c.writes] + [c for c in cases if c.writes]
        return {case.name: target.run(case) for case in ordered}
    finally:
        target.teardown()
