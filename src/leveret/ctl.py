"""`leveret ctl`: the operator's command, in the manner of rabbitmqctl.

It talks to the running broker over the control socket in its data directory
(server.ctl_socket), so only the account that runs the broker can use it.
With `--url` it talks to a broker elsewhere through the management HTTP API
instead, as a user with the administrator tag (ctl_http).
Output is a table for people, or JSON with `--formatter json` for scripts; `-q`
leaves out the `done` after a change and `-s` a table's header row too. As with
rabbitmqctl, these may come before or after the command.
Exit status: 0 done, 1 refused (the broker's message is printed), 2 usage,
69 no broker to talk to (as rabbitmqctl's "unable to perform an operation"),
77 the API refused the credentials (as rabbitmqctl's "no permission").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from leveret.server.ctl_socket import SOCKET_NAME
from leveret.server.unix_path import short_path

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69
EXIT_NOPERM = 77

# command → (help, positional arguments, takes -p VHOST)
COMMANDS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "add_vhost": ("create a vhost", ("vhost",), False),
    "delete_vhost": ("delete a vhost, its connections and all its data", ("vhost",), False),
    "list_vhosts": ("list vhosts", (), False),
    "set_vhost_limits": ("set limits, e.g. '{\"max-queues\": 10}'", ("limits",), True),
    "clear_vhost_limits": ("remove a vhost's limits", (), True),
    "add_user": ("create a user", ("username", "password"), False),
    "delete_user": ("delete a user and close its connections", ("username",), False),
    "change_password": ("set a user's password", ("username", "password"), False),
    "clear_password": ("remove a user's password (no PLAIN login)", ("username",), False),
    "set_user_tags": ("set a user's tags (none clears them)", ("username", "tags*"), False),
    "authenticate_user": ("check a user's password", ("username", "password"), False),
    "list_users": ("list users and their tags", (), False),
    "set_user_limits": (
        'set a user\'s limits, e.g. \'{"max-connections": 10, "max-channels": 20}\'',
        ("username", "limits"),
        False,
    ),
    "clear_user_limits": (
        "remove one of a user's limits, or all of them",
        ("username", "limit"),
        False,
    ),
    "list_user_limits": ("list users' limits (--user: one user's)", (), False),
    "set_permissions": ("set configure/write/read", ("username", "conf", "write", "read"), True),
    "clear_permissions": ("remove a user's permissions in a vhost", ("username",), True),
    "list_permissions": ("list permissions in a vhost", (), True),
    "list_user_permissions": ("list a user's permissions in every vhost", ("username",), False),
    "set_topic_permissions": (
        "set topic write/read on an exchange",
        ("username", "exchange", "write", "read"),
        True,
    ),
    "clear_topic_permissions": ("remove topic permissions", ("username", "exchange?"), True),
    "list_topic_permissions": ("list topic permissions in a vhost", (), True),
    "set_policy": ("set a policy", ("name", "pattern", "definition"), True),
    "clear_policy": ("remove a policy", ("name",), True),
    "list_policies": ("list policies in a vhost", (), True),
    "set_operator_policy": ("set an operator policy", ("name", "pattern", "definition"), True),
    "clear_operator_policy": ("remove an operator policy", ("name",), True),
    "list_operator_policies": ("list operator policies", (), True),
    "list_queues": ("list queues", (), True),
    "list_exchanges": ("list exchanges", (), True),
    "list_bindings": ("list bindings", (), True),
    "list_connections": ("list client connections", (), False),
    "list_mqtt_connections": ("list MQTT connections (client id, connection name, ...)", (), False),
    # Runtime parameters: shovels and federation (leveret.links), as rabbitmqctl's.
    "set_parameter": (
        "set a runtime parameter, e.g. shovel NAME '{\"src-uri\": ...}'",
        ("component", "name", "value"),
        True,
    ),
    "clear_parameter": ("remove a runtime parameter", ("component", "name"), True),
    "list_parameters": ("list runtime parameters in a vhost", (), True),
    # Global runtime parameters (broker.global_parameters), as rabbitmqctl's.
    "set_cluster_name": ("set the cluster's name (RabbitMQ's cluster_name)", ("name",), False),
    "set_global_parameter": (
        "set a global runtime parameter to a JSON value, e.g. NAME '{\"a\": 1}'",
        ("name", "value"),
        False,
    ),
    "clear_global_parameter": ("remove a global runtime parameter", ("name",), False),
    "list_global_parameters": ("list global runtime parameters", (), False),
    "shovel_status": ("the state of every shovel", (), False),
    "restart_shovel": ("restart a shovel", ("name",), True),
    "delete_shovel": ("delete a dynamic shovel", ("name",), True),
    "federation_status": ("the state of every federation link", (), False),
    "export_definitions": ("write definitions JSON to FILE ('-' for stdout)", ("file",), False),
    "import_definitions": ("import a definitions JSON file ('-' for stdin)", ("file",), False),
    # A cluster node's own socket answers these (leveret.cluster, docs/cluster.md).
    "cluster_status": ("the cluster's leader, each node's role, lag and sync", (), False),
    "transfer_leadership": ("hand the lead to NODE (an in-sync follower)", ("node",), False),
    "forget_cluster_node": ("remove NODE (stopped) from the cluster for good", ("node",), False),
    "force_boot": ("after etcd lost its data: this node's copy wins, it leads", (), False),
}
CLUSTER_COMMANDS = ("cluster_status", "transfer_leadership", "forget_cluster_node", "force_boot")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default="./leveret-data",
        help="the broker's --data-dir, where its control socket is (default %(default)s)",
    )
    parser.add_argument("--socket", help="the control socket's path (instead of --data-dir)")
    parser.add_argument(
        "--url",
        help="a broker elsewhere: its management API, e.g. http://HOST:15672 "
        "(instead of the control socket)",
    )
    parser.add_argument(
        "--username",
        dest="api_username",
        default=os.environ.get("LEVERET_CTL_USERNAME", "guest"),
        help="with --url: an administrator (default $LEVERET_CTL_USERNAME or guest)",
    )
    parser.add_argument(
        "--password",
        dest="api_password",
        default=os.environ.get("LEVERET_CTL_PASSWORD", "guest"),
        help="with --url: its password (default $LEVERET_CTL_PASSWORD, which keeps it out of "
        "the process list, or guest)",
    )
    _add_output_options(parser, default=None)
    sub = parser.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    for name, (text, positionals, per_vhost) in COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=text)
        # rabbitmqctl takes these after the command too (`list_queues -q --formatter json`).
        _add_output_options(cmd, default=argparse.SUPPRESS)
        if per_vhost:
            cmd.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
        for arg in positionals:
            if arg.endswith("*"):
                cmd.add_argument(arg[:-1], nargs="*")
            elif arg.endswith("?"):
                cmd.add_argument(arg[:-1], nargs="?")
            else:
                cmd.add_argument(arg)
        if name in ("set_policy", "set_operator_policy"):
            cmd.add_argument("--priority", type=int, default=0)
            cmd.add_argument(
                "--apply-to",
                default="all",
                choices=["all", "queues", "exchanges", "classic_queues", "streams"],
            )
        if name == "list_user_limits":
            cmd.add_argument("--user", help="only this user's limits")
        if name == "add_vhost":
            cmd.add_argument("--description", default="")
        if name == "add_user":
            cmd.add_argument("--tags", default="", help="comma-separated tags")
        if name == "export_definitions":
            cmd.add_argument("--only-vhost", help="export one vhost only")


def _add_output_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """--formatter, -q and -s, as rabbitmqctl's. On a command's parser their default is
    SUPPRESS, so that one given before the command is not reset by the command."""
    parser.add_argument(
        "--formatter",
        choices=["table", "json"],
        default="table" if default is None else default,
        help="output for people (table) or scripts (json)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if default is None else default,
        help="no 'done' after a change (listings print as ever)",
    )
    parser.add_argument(
        "-s",
        "--silent",
        action="store_true",
        default=False if default is None else default,
        help="as --quiet, and tables without their header row",
    )


class CtlError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def call(socket_path: str, op: str, args: dict[str, Any], timeout: float = 60.0) -> Any:
    """One request to the broker's control socket; CtlError when refused or unreachable."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            with short_path(socket_path) as path:  # a data dir may be deep (unix_path.py)
                sock.connect(path)
            sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        raise CtlError(
            f"no broker control socket at {socket_path}: is `leveret server` running with "
            "this --data-dir?",
            EXIT_UNAVAILABLE,
        ) from None
    except PermissionError:
        raise CtlError(
            f"permission denied on {socket_path}: run leveret ctl as the user that runs the broker",
            EXIT_UNAVAILABLE,
        ) from None
    except TimeoutError:
        raise CtlError(
            f"the broker at {socket_path} did not answer within {timeout:g} s; after a "
            "restart it answers once its stored messages are back (its log says "
            "'recovered N messages')",
            EXIT_UNAVAILABLE,
        ) from None
    except OSError as exc:
        raise CtlError(
            f"cannot reach the broker at {socket_path}: {exc}", EXIT_UNAVAILABLE
        ) from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise CtlError(
            "the broker closed the control connection without a reply", EXIT_UNAVAILABLE
        ) from None
    if "error" in reply:
        raise CtlError(reply["message"], EXIT_REFUSED)
    return reply["ok"]


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The control-socket operation and arguments for a command line."""
    c = args.ctl_command
    vhost = getattr(args, "vhost", "/")
    if c in ("add_vhost", "delete_vhost"):
        extra = {"description": args.description} if c == "add_vhost" else {}
        return c, {"name": args.vhost, **extra}
    if c == "set_vhost_limits":
        return c, {"name": vhost, "limits": _json_arg(args.limits, "limits")}
    if c == "clear_vhost_limits":
        return c, {"name": vhost}
    if c == "add_user":
        return c, {"name": args.username, "password": args.password, "tags": args.tags}
    if c in ("delete_user", "clear_password"):
        return c, {"name": args.username}
    if c in ("change_password", "authenticate_user"):
        return c, {"name": args.username, "password": args.password}
    if c == "set_user_tags":
        return c, {"name": args.username, "tags": args.tags}
    if c == "set_user_limits":
        return c, {"name": args.username, "limits": _json_arg(args.limits, "limits")}
    if c == "clear_user_limits":
        return c, {"name": args.username, "key": args.limit}
    if c == "list_user_limits":
        return c, {"name": args.user}
    if c == "set_permissions":
        return c, {
            "user": args.username,
            "vhost": vhost,
            "configure": args.conf,
            "write": args.write,
            "read": args.read,
        }
    if c == "clear_permissions":
        return c, {"user": args.username, "vhost": vhost}
    if c in ("list_permissions", "list_topic_permissions"):
        return c, {"vhost": vhost}
    if c == "list_user_permissions":
        return "list_permissions", {"user": args.username}
    if c == "set_topic_permissions":
        return c, {
            "user": args.username,
            "vhost": vhost,
            "exchange": args.exchange,
            "write": args.write,
            "read": args.read,
        }
    if c == "clear_topic_permissions":
        return c, {"user": args.username, "vhost": vhost, "exchange": args.exchange}
    if c in ("set_policy", "set_operator_policy"):
        return c, {
            "vhost": vhost,
            "name": args.name,
            "pattern": args.pattern,
            "definition": _json_arg(args.definition, "definition"),
            "priority": args.priority,
            "apply_to": args.apply_to,
        }
    if c in ("clear_policy", "clear_operator_policy"):
        return c, {"vhost": vhost, "name": args.name}
    if c in (
        "list_policies",
        "list_operator_policies",
        "list_queues",
        "list_exchanges",
        "list_bindings",
    ):
        return c, {"vhost": vhost}
    if c == "set_parameter":
        value = _json_arg(args.value, "value")
        return c, {"vhost": vhost, "component": args.component, "name": args.name, "value": value}
    if c == "clear_parameter":
        return c, {"vhost": vhost, "component": args.component, "name": args.name}
    if c == "list_parameters":
        return c, {"vhost": vhost}
    if c in ("set_cluster_name", "clear_global_parameter"):
        return c, {"name": args.name}
    if c == "set_global_parameter":
        value = _json_arg(args.value, f"the value of global parameter '{args.name}'")
        return c, {"name": args.name, "value": value}
    if c in ("restart_shovel", "delete_shovel"):
        return c, {"vhost": vhost, "name": args.name}
    if c == "export_definitions":
        return c, {"vhost": args.only_vhost}
    if c == "import_definitions":
        return c, {"definitions": _read_definitions(args.file)}
    if c in ("transfer_leadership", "forget_cluster_node"):
        return c, {"node": args.node}
    return c, {}


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not valid JSON: {exc}", EXIT_USAGE) from None


def _json_text(value: Any) -> str:
    """Compact, keys sorted: rabbitmqctl's text for a value (it keeps objects as Erlang maps)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _read_definitions(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise CtlError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{path} is not JSON: {exc}", EXIT_USAGE) from None


def format_table(rows: list[dict[str, Any]], header: bool = True) -> str:
    """Tab-separated columns with a header row (not with -s), as rabbitmqctl prints them."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["\t".join(columns)] if header else []
    for row in rows:
        lines.append("\t".join(_cell(row.get(c)) for c in columns))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def _print_cluster(args: argparse.Namespace, result: Any) -> int:
    if args.formatter == "json":
        print(json.dumps(result))
    elif args.ctl_command == "transfer_leadership":
        changed = "now leads" if result.get("changed") else "already leads"
        print(f"{result.get('leader')} {changed}")
    elif args.ctl_command == "forget_cluster_node":
        print(f"{result.get('node')} removed from the cluster")
    elif args.ctl_command == "force_boot":
        print(f"{result.get('node')} will lead with its copy (it saw term {result.get('term')})")
    else:
        print(f"Cluster {result.get('cluster', '?')}: leader {result.get('leader') or '(none)'}")
        rows = [
            {
                "node": n["name"],
                "role": n["role"],
                "running": n["running"],
                "in_sync": n["in_sync"],
                "lag_bytes": n["lag_bytes"],
            }
            for n in result.get("nodes", [])
        ]
        if rows:
            print(format_table(rows, header=not args.silent))
    return 0


def _socket_path(data_dir: str) -> str:
    """The broker's control socket under its --data-dir; a broker of worker processes
    (`--workers N`) has one per worker, and worker 0's (which writes metadata) answers."""
    path = os.path.join(data_dir, SOCKET_NAME)
    worker_0 = os.path.join(data_dir, "worker-0", SOCKET_NAME)
    if not os.path.exists(path) and os.path.exists(worker_0):
        return worker_0
    return path


def run(args: argparse.Namespace) -> int:
    try:
        op, params = _request(args)
        if args.ctl_command in CLUSTER_COMMANDS:
            from leveret.cluster.node import CTL_SOCKET

            path = os.path.join(args.data_dir, CTL_SOCKET)
            if args.url or args.socket:
                raise CtlError(
                    f"{args.ctl_command} talks to a node's own socket: use --data-dir", EXIT_USAGE
                )
            if not os.path.exists(path):
                raise CtlError(
                    f"no cluster node socket at {path}: is `leveret server --cluster-etcd` "
                    "running with this --data-dir?",
                    EXIT_UNAVAILABLE,
                )
            result = call(path, op, params)
            return _print_cluster(args, result)
        if args.url:
            from leveret.ctl_http import HttpControl

            result = HttpControl(args.url, args.api_username, args.api_password).call(op, params)
        else:
            path = args.socket or _socket_path(args.data_dir)
            result = call(path, op, params)
    except CtlError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.status
    if args.ctl_command == "list_global_parameters":
        # Values as JSON text in both formats, as rabbitmqctl prints them ("str", 42, {"a":1}).
        result = [{"name": r["name"], "value": _json_text(r["value"])} for r in result]
    if args.ctl_command == "export_definitions" and args.file != "-":
        with open(args.file, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"Exported definitions to {args.file}")
        return 0
    if args.formatter == "json" or args.ctl_command == "export_definitions":
        print(json.dumps(result, indent=2 if args.ctl_command == "export_definitions" else None))
    elif isinstance(result, list):
        text = format_table(result, header=not args.silent)
        if text:
            print(text)
    elif args.ctl_command == "authenticate_user":
        if not result:
            print(f"Error: user '{args.username}' was not authenticated", file=sys.stderr)
            return EXIT_REFUSED
        print(f"Success: user '{args.username}' authenticated")
    elif args.ctl_command == "import_definitions":
        print("Imported definitions: " + ", ".join(f"{n} {k}" for k, n in result.items() if n))
    elif not (args.quiet or args.silent):
        print("done")
    return 0
