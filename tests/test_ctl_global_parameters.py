"""`leveret ctl set_cluster_name / set_global_parameter / clear_global_parameter /
list_global_parameters` against a real `leveret server` process, over the control
socket and with `--url` (test_ctl.Server), and with `--url` against RabbitMQ 3.10's
own API when the reference runs (LEVERET_TEST_MGMT).
"""

from __future__ import annotations

import json
import os

import pika
import pytest

from test_ctl import Server, _free_port, _url_ctl, ctl

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module", params=["socket", "url"])
def broker(request, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("ctl-global") / "data", transport=request.param).wait()
    yield srv
    srv.stop()


def _rows(srv: Server) -> dict[str, str]:
    result = srv.ctl("--formatter", "json", "list_global_parameters")
    assert result.returncode == 0, result.stderr
    return {r["name"]: r["value"] for r in json.loads(result.stdout)}


def test_set_list_and_clear(broker):
    values = {"g-obj": '{"a": [1, "é"]}', "g-num": "42", "g-str": '"text"', "g-null": "null"}
    for name, value in values.items():
        result = broker.ctl("set_global_parameter", name, value)
        assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
    # As rabbitmqctl: columns name and value, each value as compact JSON text.
    table = broker.ctl("list_global_parameters")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "name\tvalue"
    for line in ('g-obj\t{"a":[1,"é"]}', "g-num\t42", 'g-str\t"text"', "g-null\tnull"):
        assert line in lines
    assert any(line.startswith('internal_cluster_id\t"leveret-cluster-id-') for line in lines)
    # --formatter json: the same text in "value", as rabbitmqctl's JSON has it.
    rows = _rows(broker)
    assert {k: rows[k] for k in values} == {
        "g-obj": '{"a":[1,"é"]}',
        "g-num": "42",
        "g-str": '"text"',
        "g-null": "null",
    }
    assert broker.ctl("set_global_parameter", "g-num", "[7]").returncode == 0
    assert _rows(broker)["g-num"] == "[7]"

    result = broker.ctl("clear_global_parameter", "g-num")
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
    assert "g-num" not in _rows(broker)


def test_set_cluster_name_names_the_broker_to_new_clients(broker):
    result = broker.ctl("set_cluster_name", f"ctl-{broker.transport} name")
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
    assert _rows(broker)["cluster_name"] == json.dumps(f"ctl-{broker.transport} name")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        name = conn._impl.server_properties["cluster_name"]
        assert (
            name.decode() if isinstance(name, bytes) else name
        ) == f"ctl-{broker.transport} name"
    finally:
        conn.close()
    # The same parameter by its name; a name that is not a string is refused, kept as it was.
    assert broker.ctl("set_global_parameter", "cluster_name", '"by-parameter"').returncode == 0
    assert _rows(broker)["cluster_name"] == '"by-parameter"'
    result = broker.ctl("set_global_parameter", "cluster_name", '{"not": "a string"}')
    assert result.returncode == 1
    assert result.stderr == 'Error: cluster_name must be a string, got {"not": "a string"}\n'
    assert _rows(broker)["cluster_name"] == '"by-parameter"'


def test_bad_input_is_refused_with_a_message(broker):
    result = broker.ctl("set_global_parameter", "g-bad", "{not json")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "Error: the value of global parameter 'g-bad' is not valid JSON: "
    ), result.stderr
    assert "g-bad" not in _rows(broker)
    for args in (("set_global_parameter", "g-bad"), ("set_cluster_name",),
                 ("clear_global_parameter",), ("list_global_parameters", "extra")):  # fmt: skip
        result = broker.ctl(*args)
        assert result.returncode == 2, args
        assert f"leveret ctl {args[0]}" in result.stderr or "unrecognized" in result.stderr
    result = broker.ctl("clear_global_parameter", "g-nope")
    assert (result.returncode, result.stderr) == (1, "Error: no global parameter 'g-nope'\n")


def test_only_administrators_and_policymakers(tmp_path):
    """Over --url the API's rules, as RabbitMQ's: global parameters for administrators and
    policymakers, the cluster name for administrators; a refusal is exit 77."""
    srv = Server(tmp_path / "data", transport="url").wait()
    try:
        for user, tags in (("mon", "monitoring"), ("pm", "policymaker")):
            assert srv.ctl("add_user", user, "pw", "--tags", tags).returncode == 0

        def as_user(user: str, *args: str):
            return _url_ctl(srv.url, "--username", user, "--password", "pw", *args)

        for args in (("list_global_parameters",), ("set_global_parameter", "g", "1"),
                     ("clear_global_parameter", "g"), ("set_cluster_name", "x")):  # fmt: skip
            result = as_user("mon", *args)
            assert result.returncode == 77, (args, result.stderr)
            assert result.stderr.startswith(f"Error: user 'mon' may not {args[0]}: "), result.stderr
        assert as_user("pm", "set_global_parameter", "g", "1").returncode == 0
        assert "g\t1" in as_user("pm", "list_global_parameters").stdout.splitlines()
        result = as_user("pm", "set_cluster_name", "x")
        assert result.returncode == 77
        assert result.stderr.startswith("Error: user 'pm' may not set_cluster_name: "), (
            result.stderr
        )
        assert as_user("pm", "clear_global_parameter", "g").returncode == 0
        result = _url_ctl(srv.url, "--password", "wrong", "set_global_parameter", "g", "1")
        assert result.returncode == 77 and "login failed" in result.stderr
        assert "cluster_name" not in json.loads(
            srv.ctl("--formatter", "json", "list_global_parameters").stdout
        )
    finally:
        srv.stop()


def test_no_broker_is_exit_69(tmp_path):
    for args in (("set_cluster_name", "x"), ("set_global_parameter", "g", "1"),
                 ("list_global_parameters",)):  # fmt: skip
        result = ctl("--data-dir", str(tmp_path), *args)
        assert result.returncode == 69, args
        assert f"no broker control socket at {tmp_path}/ctl.sock" in result.stderr
        result = _url_ctl(f"http://127.0.0.1:{_free_port()}", *args)
        assert result.returncode == 69, args
        assert "cannot reach the management API at http://127.0.0.1:" in result.stderr


def test_global_parameters_over_url_on_rabbitmq():
    """The same commands against RabbitMQ 3.10's own API (LEVERET_TEST_MGMT); the cluster
    name is left alone there, since other tests share that broker."""
    from access_setup import RABBITMQ_API

    base = RABBITMQ_API.removesuffix("/api")
    if _url_ctl(base, "list_global_parameters").returncode == 69:
        pytest.skip(f"the reference RabbitMQ's API is not running at {base}")
    name = f"ctl-{os.urandom(3).hex()}"
    result = _url_ctl(base, "set_global_parameter", name, '{"a": [1, "x"]}')
    assert result.returncode == 0, result.stderr
    try:
        table = _url_ctl(base, "list_global_parameters").stdout.splitlines()
        assert table[0] == "name\tvalue" and f'{name}\t{{"a":[1,"x"]}}' in table
        assert any(line.startswith('internal_cluster_id\t"rabbitmq-cluster-id-') for line in table)
        rows = json.loads(_url_ctl(base, "--formatter", "json", "list_global_parameters").stdout)
        assert {"name": name, "value": '{"a":[1,"x"]}'} in rows
    finally:
        assert _url_ctl(base, "clear_global_parameter", name).returncode == 0
    result = _url_ctl(base, "clear_global_parameter", name)
    assert (result.returncode, result.stderr) == (1, f"Error: no global parameter '{name}'\n")


def test_rabbitmqctl_output_options_before_or_after_the_command(broker):
    """-q (no `done`), -s (no header row either) and --formatter, where rabbitmqctl
    takes them: before the command or after it."""
    for argv in (("-q", "set_global_parameter", "g-q", "1"),
                 ("set_global_parameter", "g-q", "2", "--quiet"),
                 ("set_global_parameter", "g-q", "3", "-s")):  # fmt: skip
        result = broker.ctl(*argv)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), argv
    silent = broker.ctl("list_global_parameters", "-s").stdout.splitlines()
    assert "g-q\t3" in silent and "name\tvalue" not in silent
    assert broker.ctl("-q", "list_global_parameters").stdout.startswith("name\tvalue\n")
    after = broker.ctl("list_global_parameters", "--formatter", "json")
    assert {"name": "g-q", "value": "3"} in json.loads(after.stdout)
    # Given twice, the one after the command wins.
    both = broker.ctl("--formatter", "json", "list_users", "--formatter", "table")
    assert both.stdout.startswith("name\ttags\n")
