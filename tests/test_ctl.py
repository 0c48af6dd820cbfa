"""`leveret ctl` against a real `leveret server` process.

The tests that use the `server` fixture run twice: over the control socket and
with `--url` over the management HTTP API, so both ways give the same tables,
JSON, messages and exit codes. test_ctl_url_on_rabbitmq runs the `--url` way
against the reference RabbitMQ's own API.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time

import pika
import pika.exceptions
import pytest

from serverproc import server_argv

pytestmark = pytest.mark.leveret_only

# guest/guest as RabbitMQ 3.10 exported it; vhost and permissions in its format.
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8",
    "rabbitmq_version": "3.10.8",
    "product_name": "RabbitMQ",
    "product_version": "3.10.8",
    "users": [
        {
            "name": "imported",
            "password_hash": "kjnepyXPQpB+7U3OjXc432p8s/DS2geaFZbarrppqGJNn2QG",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["management"],
            "limits": {},
        }
    ],
    "vhosts": [{"name": "from-rabbit"}],
    "permissions": [
        {"user": "imported", "vhost": "from-rabbit", "configure": ".*", "write": ".*", "read": ".*"}
    ],
    "topic_permissions": [],
    "parameters": [
        {"value": {"max-queues": 7}, "vhost": "from-rabbit", "component": "vhost-limits", "name": "limits"}
    ],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}],
    "policies": [],
    "queues": [
        {"name": "jobs", "vhost": "from-rabbit", "durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}
    ],
    "exchanges": [
        {"name": "events", "vhost": "from-rabbit", "type": "topic", "durable": True, "auto_delete": False, "internal": False, "arguments": {}}
    ],
    "bindings": [
        {"source": "events", "vhost": "from-rabbit", "destination": "jobs", "destination_type": "queue", "routing_key": "job.#", "arguments": {}}
    ],
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir, *extra: str, transport: str = "socket") -> None:
        self.data_dir = str(data_dir)
        self.transport = transport
        self.port = _free_port()
        self.management_port = _free_port()
        self.log_path = os.path.join(os.path.dirname(self.data_dir), f"server-{self.port}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*server_argv(), "--port", str(self.port),
             "--data-dir", self.data_dir, "--management-port", str(self.management_port),
             "--prometheus-port", "0", *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait(self) -> Server:
        deadline = time.monotonic() + 30
        sock = os.path.join(self.data_dir, "ctl.sock")
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, open(self.log_path).read()
            if os.path.exists(sock):
                with socket.socket() as s, socket.socket() as m:
                    if (
                        s.connect_ex(("127.0.0.1", self.port)) == 0
                        and m.connect_ex(("127.0.0.1", self.management_port)) == 0
                    ):
                        return self
            time.sleep(0.05)
        raise AssertionError("broker did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def ctl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        if self.transport == "url":
            return ctl("--url", self.url, "--username", "guest", "--password", "guest", *args,
                       stdin=stdin)  # fmt: skip
        return ctl("--data-dir", self.data_dir, *args, stdin=stdin)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


def ctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


@pytest.fixture(scope="module", params=["socket", "url"])
def server(request, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("ctl") / "data", transport=request.param).wait()
    yield srv
    srv.stop()


def _login(port: int, user: str, password: str, vhost: str):
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), connection_attempts=1
        )
    )


def test_a_tenant_in_four_commands(server):
    assert server.ctl("add_vhost", "shop").returncode == 0
    assert server.ctl("add_user", "alice", "s3cret").returncode == 0
    assert (
        server.ctl("set_permissions", "-p", "shop", "alice", "^alice-", ".*", ".*").returncode == 0
    )
    conn = _login(server.port, "alice", "s3cret", "shop")
    ch = conn.channel()
    ch.queue_declare("alice-orders")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("bob-orders")
    assert info.value.reply_code == 403
    conn.close()
    listing = server.ctl("list_queues", "-p", "shop")
    assert listing.stdout.splitlines()[0].split("\t")[:3] == ["name", "messages", "consumers"]
    assert "alice-orders\t0\t0\tclassic" in listing.stdout
    perms = json.loads(server.ctl("--formatter", "json", "list_permissions", "-p", "shop").stdout)
    assert perms == [
        {"user": "alice", "vhost": "shop", "configure": "^alice-", "write": ".*", "read": ".*"}
    ]


def test_listings_as_tables_and_json(server):
    vhosts = server.ctl("list_vhosts")
    assert vhosts.returncode == 0 and vhosts.stdout.startswith("name\tdescription\ttags\tlimits")
    users = json.loads(server.ctl("--formatter", "json", "list_users").stdout)
    assert {"name": "guest", "tags": ["administrator"]} in users
    exchanges = server.ctl("list_exchanges").stdout
    assert "amq.topic\ttopic\ttrue\tfalse\tfalse" in exchanges
    conn = _login(server.port, "guest", "guest", "/")
    connections = json.loads(server.ctl("--formatter", "json", "list_connections").stdout)
    assert [c["user"] for c in connections] == ["guest"]
    conn.close()


def test_unknown_names_are_refused_with_the_broker_message(server):
    cases = [
        (("delete_user", "nobody"), "Error: user 'nobody' does not exist"),
        (("delete_vhost", "nowhere"), "Error: vhost 'nowhere' does not exist"),
        (("set_permissions", "-p", "nowhere", "guest", ".*", ".*", ".*"), "Error: vhost 'nowhere' does not exist"),
        (("clear_permissions", "-p", "/", "nobody"), "Error: user 'nobody' does not exist"),
        (("add_user", "guest", "x"), "Error: user 'guest' already exists"),
        (("set_permissions", "guest", "(", ".*", ".*"), "Error: invalid regular expression '(' for configure permission"),
        (("set_vhost_limits", "{\"max-widgets\": 1}"), "Error: unknown vhost limit 'max-widgets'"),
    ]  # fmt: skip
    for args, message in cases:
        result = server.ctl(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(message), (args, result.stderr)


def test_unknown_commands_and_bad_json_are_usage_errors(server):
    result = server.ctl("add_vhosts", "x")
    assert result.returncode == 2 and "invalid choice: 'add_vhosts'" in result.stderr
    result = server.ctl("set_vhost_limits", "{max-queues: 1}")
    assert result.returncode == 2 and "Error: limits is not valid JSON" in result.stderr


def test_no_broker_is_exit_69(tmp_path):
    result = ctl("--data-dir", str(tmp_path), "list_users")
    assert result.returncode == 69
    assert f"no broker control socket at {tmp_path}/ctl.sock" in result.stderr


def test_the_socket_is_for_the_owner_only(server):
    mode = stat.S_IMODE(os.stat(os.path.join(server.data_dir, "ctl.sock")).st_mode)
    assert mode == 0o600


def test_a_data_dir_deeper_than_a_unix_socket_path_still_has_ctl(tmp_path):
    """sun_path takes 107 bytes: a data dir deep in a CI workspace must neither stop
    the broker nor leave it without `leveret ctl` (server/unix_path.py)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "data"
    deep.parent.mkdir(parents=True)
    assert len(str(deep / "ctl.sock")) > 107
    srv = Server(deep).wait()
    try:
        result = srv.ctl("--formatter", "json", "list_vhosts")
        assert result.returncode == 0, result.stderr
        assert "/" in [v["name"] for v in json.loads(result.stdout)]
        mode = os.stat(deep / "ctl.sock").st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    finally:
        srv.stop()
    assert not (deep / "ctl.sock").exists()  # removed at a clean stop


def test_change_password_and_tags(server):
    server.ctl("add_user", "carol", "one")
    server.ctl("set_permissions", "carol", ".*", ".*", ".*")
    assert server.ctl("authenticate_user", "carol", "one").returncode == 0
    assert server.ctl("change_password", "carol", "two").returncode == 0
    result = server.ctl("authenticate_user", "carol", "one")
    assert result.returncode == 1 and "user 'carol' was not authenticated" in result.stderr
    _login(server.port, "carol", "two", "/").close()
    server.ctl("set_user_tags", "carol", "monitoring", "impersonator")
    users = json.loads(server.ctl("--formatter", "json", "list_users").stdout)
    assert {"name": "carol", "tags": ["monitoring", "impersonator"]} in users


def test_a_rabbitmq_export_imports_and_its_users_log_in(server, tmp_path):
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(RABBITMQ_EXPORT))
    result = server.ctl("import_definitions", str(path))
    assert result.returncode == 0, result.stderr
    conn = _login(server.port, "imported", "guest", "from-rabbit")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("events", "job.new", b"j1")
    assert ch.queue_declare("jobs", passive=True).method.message_count == 1
    conn.close()
    limits = json.loads(server.ctl("--formatter", "json", "list_vhosts").stdout)
    assert {
        "name": "from-rabbit",
        "description": "",
        "tags": [],
        "limits": {"max-queues": 7},
    } in limits


@pytest.mark.parametrize(
    "change, message",
    [
        ({"userz": []}, "Error: unknown key 'userz' in definitions"),
        ({"users": [{"name": "x", "pasword_hash": "abc"}]}, "Error: unknown key 'pasword_hash' in users[0]"),
        ({"users": [{"name": "x", "password_hash": "AAAA"}]}, "Error: users[0]: password_hash 'AAAA' has 3 bytes"),
        ({"permissions": [{"user": "guest", "vhost": "ghost", "configure": ".*"}]}, "Error: permissions[0]: vhost 'ghost' does not exist"),
        ({"permissions": [{"user": "guest", "vhost": "/", "configure": "[", "write": "", "read": ""}]}, "Error: permissions[0]: invalid regular expression '['"),
    ],
)  # fmt: skip
def test_bad_definitions_are_refused_before_anything_changes(server, tmp_path, change, message):
    before = server.ctl("--formatter", "json", "export_definitions", "-").stdout
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(change))
    result = server.ctl("import_definitions", str(path))
    assert result.returncode == 1
    if server.transport == "url" and "vhost 'ghost'" in message:
        # the API answers RabbitMQ's ["no_such_vhost", "ghost"], which names no place
        message = message.replace("permissions[0]: ", "")
    assert result.stderr.startswith(message), result.stderr
    assert server.ctl("--formatter", "json", "export_definitions", "-").stdout == before


def test_export_then_load_at_boot_on_another_broker(server, tmp_path):
    server.ctl("add_vhost", "moving")
    server.ctl("add_user", "mover", "pw")
    server.ctl("set_permissions", "-p", "moving", "mover", ".*", ".*", ".*")
    conn = _login(server.port, "guest", "guest", "/")
    conn.close()
    export = tmp_path / "export.json"
    result = server.ctl("export_definitions", str(export))
    assert result.returncode == 0 and export.exists()
    doc = json.loads(export.read_text())
    assert {u["name"] for u in doc["users"]} >= {"guest", "mover"}
    assert all(u["hashing_algorithm"] == "rabbit_password_hashing_sha256" for u in doc["users"])
    other = Server(tmp_path / "other", "--load-definitions", str(export)).wait()
    try:
        _login(other.port, "mover", "pw", "moving").close()
    finally:
        other.stop()


def test_an_import_keeps_what_exists_and_skips_bindings_with_a_missing_end(server):
    """As RabbitMQ 3.10 (recorded: tests/compat/http definitions.import.*): a queue or
    exchange imported again with other arguments or type keeps what it has; a binding
    to a queue that does not exist is skipped; a bad argument of a new queue is
    refused with the AMQP error."""
    queue = {"name": "kept", "vhost": "/", "durable": True, "auto_delete": False}
    exchange = {"name": "kept-x", "vhost": "/", "type": "direct", "durable": True}
    first = {"queues": [{**queue, "arguments": {"x-max-length": 10}}], "exchanges": [exchange]}
    assert server.ctl("import_definitions", "-", stdin=json.dumps(first)).returncode == 0
    again = {
        "queues": [{**queue, "arguments": {"x-max-length": 20}}],
        "exchanges": [{**exchange, "type": "topic"}],
        "bindings": [
            {"source": "kept-x", "vhost": "/", "destination": "zz", "destination_type": "queue"}
        ],
    }
    result = server.ctl("import_definitions", "-", stdin=json.dumps(again))
    assert result.returncode == 0, result.stderr
    export = json.loads(server.ctl("export_definitions", "-").stdout)
    assert [q["arguments"] for q in export["queues"] if q["name"] == "kept"] == [
        {"x-max-length": 10}
    ]
    assert [x["type"] for x in export["exchanges"] if x["name"] == "kept-x"] == ["direct"]
    assert [b for b in export["bindings"] if b["source"] == "kept-x"] == []
    bad = {"queues": [{**queue, "name": "bad", "arguments": {"x-max-length": "abc"}}]}
    result = server.ctl("import_definitions", "-", stdin=json.dumps(bad))
    assert result.returncode == 1
    assert result.stderr.startswith(
        "Error: precondition_failed: invalid arg 'x-max-length' for queue 'bad' in vhost '/'"
    ), result.stderr


def test_a_bad_definitions_file_stops_the_start(tmp_path):
    path = tmp_path / "defs.json"
    path.write_text('{"users": [{"name": "x", "password_hash": "@@"}]}')
    proc = subprocess.run(
        [*server_argv(), "--port", str(_free_port()),
         "--data-dir", str(tmp_path / "d"), "--load-definitions", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert (
        f"cannot start: definitions file {path}: users[0]: password_hash '@@' is not valid base64"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_the_readme_secure_setup_uses_real_ctl_commands():
    """Every `leveret ctl` line in the README's secure setup parses as a command."""
    import re
    from pathlib import Path

    from leveret.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = re.findall(r"^python -m leveret ctl (.+)$", readme, flags=re.M)
    assert len(lines) >= 4
    parser = build_parser()
    for line in lines:
        import shlex

        args = parser.parse_args(["ctl", *shlex.split(line, comments=True)])
        assert args.command == "ctl"


def test_policies_from_the_command_line(server):
    result = server.ctl(
        "set_policy",
        "--apply-to",
        "queues",
        "--priority",
        "3",
        "cap",
        "^capped-",
        '{"max-length": 2}',
    )
    assert result.returncode == 0, result.stderr
    policies = json.loads(server.ctl("--formatter", "json", "list_policies").stdout)
    assert policies == [
        {
            "vhost": "/",
            "name": "cap",
            "pattern": "^capped-",
            "apply-to": "queues",
            "definition": {"max-length": 2},
            "priority": 3,
        }
    ]
    conn = _login(server.port, "guest", "guest", "/")
    ch = conn.channel()
    ch.queue_declare("capped-1", auto_delete=True)
    ch.confirm_delivery()
    for _ in range(4):
        ch.basic_publish("", "capped-1", b"x")
    assert ch.queue_declare("capped-1", passive=True).method.message_count == 2
    conn.close()
    export = json.loads(server.ctl("export_definitions", "-").stdout)
    assert export["policies"][0]["name"] == "cap"
    result = server.ctl("set_policy", "bad", "(", '{"max-length": 2}')
    assert result.returncode == 1
    # Over the socket Leveret's text; over --url the HTTP API's, which is RabbitMQ's.
    assert result.stderr.startswith(
        (
            "Error: policy 'bad': invalid regular expression '('",
            "Error: Validation failed\n\npattern should be regular expression but is invalid",
        )
    ), result.stderr
    result = server.ctl("clear_policy", "nope")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: policy 'nope' does not exist in vhost '/'")
    assert server.ctl("clear_policy", "cap").returncode == 0


def test_topic_permissions_limits_and_operator_policies(server):
    assert server.ctl("add_user", "tp", "pw").returncode == 0
    for exchange, write in (("amq.topic", "^a"), ("events", "^b"), ("logs", "^c")):
        result = server.ctl("set_topic_permissions", "tp", exchange, write, ".*")
        assert result.returncode == 0, result.stderr
    assert server.ctl("clear_topic_permissions", "tp", "events").returncode == 0
    rows = json.loads(server.ctl("--formatter", "json", "list_topic_permissions").stdout)
    assert [(r["exchange"], r["write"]) for r in rows if r["user"] == "tp"] == [
        ("amq.topic", "^a"),
        ("logs", "^c"),
    ]
    result = server.ctl("clear_topic_permissions", "tp", "events")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "Error: user 'tp' has no topic permissions in vhost '/' for exchange 'events'"
    )
    assert server.ctl("clear_topic_permissions", "tp").returncode == 0
    rows = json.loads(server.ctl("--formatter", "json", "list_topic_permissions").stdout)
    assert [r for r in rows if r["user"] == "tp"] == []

    server.ctl("set_permissions", "-p", "/", "tp", "", "", ".*")
    rows = json.loads(server.ctl("--formatter", "json", "list_user_permissions", "tp").stdout)
    assert rows == [{"user": "tp", "vhost": "/", "configure": "", "write": "", "read": ".*"}]
    assert server.ctl("clear_password", "tp").returncode == 0
    assert server.ctl("authenticate_user", "tp", "pw").returncode == 1

    server.ctl("add_vhost", "limited")
    limits = '{"max-queues": 3, "max-connections": 5}'
    assert server.ctl("set_vhost_limits", "-p", "limited", limits).returncode == 0
    vhosts = json.loads(server.ctl("--formatter", "json", "list_vhosts").stdout)
    [limited] = [v for v in vhosts if v["name"] == "limited"]
    assert limited["limits"] == {"max-queues": 3, "max-connections": 5}
    assert server.ctl("clear_vhost_limits", "-p", "limited").returncode == 0
    vhosts = json.loads(server.ctl("--formatter", "json", "list_vhosts").stdout)
    assert [v["limits"] for v in vhosts if v["name"] == "limited"] == [{}]

    result = server.ctl("set_operator_policy", "-p", "limited", "--apply-to", "queues", "cap", ".*",
                        '{"max-length": 9}')  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(
        server.ctl("--formatter", "json", "list_operator_policies", "-p", "limited").stdout
    )
    assert [(r["name"], r["definition"]) for r in rows] == [("cap", {"max-length": 9})]
    assert server.ctl("clear_operator_policy", "-p", "limited", "cap").returncode == 0
    result = server.ctl("clear_operator_policy", "-p", "limited", "cap")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "Error: operator policy 'cap' does not exist in vhost 'limited'"
    ), result.stderr
    assert server.ctl("delete_vhost", "limited").returncode == 0
    assert server.ctl("delete_user", "tp").returncode == 0


def test_user_limits(server):
    assert server.ctl("add_user", "lim", "pw").returncode == 0
    server.ctl("set_permissions", "-p", "/", "lim", ".*", ".*", ".*")
    result = server.ctl("set_user_limits", "lim", '{"max-connections": 1, "max-channels": 4}')
    assert result.returncode == 0, result.stderr
    rows = json.loads(server.ctl("--formatter", "json", "list_user_limits").stdout)
    assert {"user": "lim", "value": {"max-connections": 1, "max-channels": 4}} in rows

    first = _login(server.port, "lim", "pw", "/")
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            _login(server.port, "lim", "pw", "/")
        assert "user connection limit (1) is reached" in str(info.value)
    finally:
        first.close()
    # A new password keeps the limits; clearing one keeps the other.
    assert server.ctl("change_password", "lim", "pw2").returncode == 0
    assert server.ctl("clear_user_limits", "lim", "max-connections").returncode == 0
    one = json.loads(server.ctl("--formatter", "json", "list_user_limits", "--user", "lim").stdout)
    assert one == [{"user": "lim", "value": {"max-channels": 4}}]

    for args, message in (
        (("set_user_limits", "nobody", '{"max-channels": 1}'), "user 'nobody' does not exist"),
        (("set_user_limits", "lim", '{"max-foo": 1}'), "Unrecognised terms"),
    ):
        result = server.ctl(*args)
        assert result.returncode == 1 and message in result.stderr, (args, result.stderr)
    assert server.ctl("clear_user_limits", "lim", "all").returncode == 0
    rows = json.loads(server.ctl("--formatter", "json", "list_user_limits").stdout)
    assert [r for r in rows if r["user"] == "lim"] == []
    assert server.ctl("delete_user", "lim").returncode == 0


def test_user_limits_travel_in_definitions(server):
    server.ctl("add_user", "limdef", "pw")
    server.ctl("set_user_limits", "limdef", '{"max-channels": 3}')
    export = json.loads(server.ctl("export_definitions", "-").stdout)
    [user] = [u for u in export["users"] if u["name"] == "limdef"]
    assert user["limits"] == {"max-channels": 3}
    assert all("limits" in u for u in export["users"])  # as RabbitMQ's, {} when none
    user["limits"] = {"max-connections": 2}  # an import replaces the user's limits
    result = server.ctl("import_definitions", "-", stdin=json.dumps({"users": [user]}))
    assert result.returncode == 0, result.stderr
    one = json.loads(
        server.ctl("--formatter", "json", "list_user_limits", "--user", "limdef").stdout
    )
    assert one == [{"user": "limdef", "value": {"max-connections": 2}}]
    user["limits"] = {"max-sessions": 2}
    result = server.ctl("import_definitions", "-", stdin=json.dumps({"users": [user]}))
    assert result.returncode == 1 and "users[0]: Unrecognised terms" in result.stderr
    server.ctl("delete_user", "limdef")


def test_global_parameters_travel_in_definitions(server):
    """A RabbitMQ export's global parameters (its cluster name, any other) are imported,
    and exported again; a cluster name that is not a string refuses the file."""
    doc = {
        "global_parameters": [
            {"name": "cluster_name", "value": "ctl-imported"},
            {"name": "ctl-setting", "value": {"a": [1, 2]}},
        ]
    }
    result = server.ctl("import_definitions", "-", stdin=json.dumps(doc))
    assert result.returncode == 0, result.stderr
    export = json.loads(server.ctl("export_definitions", "-").stdout)
    params = {p["name"]: p["value"] for p in export["global_parameters"]}
    assert params["cluster_name"] == "ctl-imported"
    assert params["ctl-setting"] == {"a": [1, 2]}
    assert "internal_cluster_id" in params
    conn = _login(server.port, "guest", "guest", "/")
    assert conn._impl.server_properties["cluster_name"] in ("ctl-imported", b"ctl-imported")
    conn.close()
    bad = {"global_parameters": [{"name": "cluster_name", "value": ["a"]}]}
    result = server.ctl("import_definitions", "-", stdin=json.dumps(bad))
    assert result.returncode == 1
    assert 'global_parameters[0]: cluster_name must be a string, got ["a"]' in result.stderr
    export = json.loads(server.ctl("export_definitions", "-").stdout)
    assert {"name": "cluster_name", "value": "ctl-imported"} in export["global_parameters"]


# --- only with --url ----------------------------------------------------------


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("ctl-url") / "data", transport="url").wait()
    yield srv
    srv.stop()


def _url_ctl(url: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_url_credentials_from_the_url_and_the_environment(api_server):
    port = api_server.management_port
    result = _url_ctl(f"http://guest:guest@127.0.0.1:{port}", "list_users")
    assert result.returncode == 0 and "guest\tadministrator" in result.stdout
    result = _url_ctl(api_server.url, "list_users", env={"LEVERET_CTL_PASSWORD": "guest"})
    assert result.returncode == 0 and "guest\tadministrator" in result.stdout


def test_url_wrong_password_and_missing_tags_are_exit_77(api_server):
    result = _url_ctl(api_server.url, "--password", "wrong", "list_users")
    assert result.returncode == 77
    assert result.stderr == (
        f"Error: the management API at {api_server.url} refused user 'guest': "
        "login failed (check --username and --password)\n"
    )
    api_server.ctl("add_user", "plain", "pw")
    result = _url_ctl(api_server.url, "--username", "plain", "--password", "pw", "list_vhosts")
    assert result.returncode == 77
    assert "user 'plain' has no management tag" in result.stderr
    api_server.ctl("set_user_tags", "plain", "management")
    result = _url_ctl(api_server.url, "--username", "plain", "--password", "pw", "list_users")
    assert result.returncode == 77
    assert result.stderr.startswith("Error: user 'plain' may not list_users: "), result.stderr
    # Commands that change nothing the user may not see still work for a management user.
    assert api_server.ctl("authenticate_user", "plain", "pw").returncode == 0


def test_url_without_an_api_is_exit_69_and_a_bad_url_is_exit_2(api_server):
    result = _url_ctl(f"http://127.0.0.1:{_free_port()}", "list_users")
    assert result.returncode == 69
    assert "cannot reach the management API at http://127.0.0.1:" in result.stderr
    assert "Connection refused" in result.stderr
    # The AMQP port is not an HTTP API.
    result = _url_ctl(f"http://127.0.0.1:{api_server.port}", "list_users")
    assert result.returncode == 69, result.stderr
    result = _url_ctl("127.0.0.1:15672", "list_users")
    assert result.returncode == 2
    assert "--url must be http://HOST:PORT or https://HOST:PORT" in result.stderr


def test_ctl_url_on_rabbitmq():
    """The same `--url` commands against RabbitMQ's own management API (15673)."""
    from access_setup import RABBITMQ_API

    base = RABBITMQ_API.removesuffix("/api")
    probe = _url_ctl(base, "list_vhosts")
    if probe.returncode == 69:
        pytest.skip(f"the reference RabbitMQ's API is not running at {base}")
    suffix = os.urandom(3).hex()
    vhost, user = f"ctl-{suffix}", f"ctl-{suffix}"

    def run(*args: str) -> subprocess.CompletedProcess:
        result = _url_ctl(base, *args)
        assert result.returncode == 0, (args, result.stderr)
        return result

    run("add_vhost", vhost)
    try:
        run("add_user", user, "pw", "--tags", "monitoring")
        run("set_permissions", "-p", vhost, user, "^q", ".*", ".*")
        for exchange in ("amq.topic", "events"):
            run("set_topic_permissions", "-p", vhost, user, exchange, "^w", "^r")
        run("clear_topic_permissions", "-p", vhost, user, "events")
        topics = json.loads(
            run("--formatter", "json", "list_topic_permissions", "-p", vhost).stdout
        )
        assert [t["exchange"] for t in topics] == ["amq.topic"]
        run("set_user_tags", user, "management")
        assert run("authenticate_user", user, "pw").returncode == 0
        assert _url_ctl(base, "authenticate_user", user, "nope").returncode == 1
        run("set_user_limits", user, '{"max-connections": 3, "max-channels": 9}')
        limits = json.loads(run("--formatter", "json", "list_user_limits", "--user", user).stdout)
        assert limits == [{"user": user, "value": {"max-channels": 9, "max-connections": 3}}]
        run("clear_user_limits", user, "max-channels")
        limits = json.loads(run("--formatter", "json", "list_user_limits", "--user", user).stdout)
        assert limits == [{"user": user, "value": {"max-connections": 3}}]
        run("set_vhost_limits", "-p", vhost, '{"max-queues": 4}')
        vhosts = json.loads(run("--formatter", "json", "list_vhosts").stdout)
        assert [v["limits"] for v in vhosts if v["name"] == vhost] == [{"max-queues": 4}]
        run("set_policy", "-p", vhost, "--apply-to", "queues", "cap", "^q", '{"max-length": 2}')
        policies = json.loads(run("--formatter", "json", "list_policies", "-p", vhost).stdout)
        assert [(p["name"], p["apply-to"], p["priority"]) for p in policies] == [
            ("cap", "queues", 0)
        ]
        assert run("list_queues", "-p", vhost).stdout == ""
        exchanges = run("list_exchanges", "-p", vhost).stdout
        assert "amq.topic\ttopic\ttrue\tfalse\tfalse" in exchanges
        export = json.loads(run("export_definitions", "--only-vhost", vhost, "-").stdout)
        assert export["policies"][0]["name"] == "cap"
        result = _url_ctl(base, "add_user", user, "again")
        assert result.returncode == 1
        assert result.stderr.startswith(f"Error: user '{user}' already exists")
        result = _url_ctl(base, "clear_policy", "-p", vhost, "nope")
        assert result.stderr.startswith(f"Error: policy 'nope' does not exist in vhost '{vhost}'")
    finally:
        _url_ctl(base, "delete_user", user)
        run("delete_vhost", vhost)
    result = _url_ctl(base, "delete_vhost", vhost)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: vhost '{vhost}' does not exist")
