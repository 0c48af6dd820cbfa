"""Definitions in the JSON of RabbitMQ's export and `load_definitions`.

Export writes what RabbitMQ 3.10 writes (users with their hashes, vhosts,
permissions, topic permissions, parameters (vhost limits, shovels, federation
upstreams and sets), global parameters, queues, exchanges, bindings), so a Leveret
export imports into RabbitMQ and the other way round. Import checks the whole document
before it changes anything, and refuses unknown keys (RabbitMQ ignores them; a typo
then silently loses a setting) and bad password hashes, naming the place:
`users[2].tags`.

Queues, exchanges and bindings are then made as RabbitMQ 3.10 makes them (recorded:
tests/compat/http, definitions.import.*): a queue or exchange that exists keeps what it
has, whatever the file says (no equivalence check); a binding whose source or
destination does not exist is skipped; a declaration refused stops the import with the
AMQP error's reason (`precondition_failed: invalid arg ...`, `command_invalid: unknown
exchange type 'nope'`), what was made before it staying.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import leveret
from leveret.auth import passwords
from leveret.auth.users import Permission, TopicPermission, check_user_limits, parse_tags
from leveret.broker.errors import (
    AccessRefused,
    InvalidValue,
    ModelError,
    NotFound,
    NotSupported,
    ResourceLocked,
    UnknownType,
)
from leveret.broker.global_parameters import check_value
from leveret.broker.policies import Policy
from leveret.protocol.fieldtable import Long

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

TOP_LEVEL = {
    "rabbit_version": str,
    "rabbitmq_version": str,
    "product_name": str,
    "product_version": str,
    "users": list,
    "vhosts": list,
    "permissions": list,
    "topic_permissions": list,
    "parameters": list,
    "global_parameters": list,
    "policies": list,
    "queues": list,
    "exchanges": list,
    "bindings": list,
}

# For each list: its keys, and which of them are required.
ITEM_KEYS: dict[str, tuple[set[str], set[str]]] = {
    "users": (
        {"name", "password_hash", "password", "hashing_algorithm", "tags", "limits"},
        {"name"},
    ),
    "vhosts": (
        {"name", "description", "tags", "metadata", "limits", "default_queue_type"},
        {"name"},
    ),
    "permissions": ({"user", "vhost", "configure", "write", "read"}, {"user", "vhost"}),
    "topic_permissions": (
        {"user", "vhost", "exchange", "write", "read"},
        {"user", "vhost", "exchange"},
    ),
    "parameters": (
        {"vhost", "component", "name", "value"},
        {"vhost", "component", "name", "value"},
    ),
    "global_parameters": ({"name", "value"}, {"name", "value"}),
    "policies": (
        {"vhost", "name", "pattern", "apply-to", "definition", "priority"},
        {"vhost", "name", "pattern", "definition"},
    ),
    "queues": ({"name", "vhost", "durable", "auto_delete", "arguments", "type"}, {"name", "vhost"}),
    "exchanges": (
        {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"},
        {"name", "vhost", "type"},
    ),
    "bindings": (
        {"source", "vhost", "destination", "destination_type", "routing_key", "arguments"},
        {"source", "vhost", "destination", "destination_type"},
    ),
}


class DefinitionsRefused(InvalidValue):
    """An import refused with RabbitMQ's reason, which the management API answers as
    it is: `["no_such_vhost", name]`, or the AMQP error a declaration met. `str()` is
    the sentence `leveret ctl` prints."""

    def __init__(self, text: str, reason: Any) -> None:
        super().__init__(text)
        self.reason = reason


#: a declaration's error as the name of the AMQP reply code RabbitMQ would close with
#: (most specific first), the prefix of the import's reason
REPLY_NAMES: tuple[tuple[type[ModelError], str], ...] = (
    (NotFound, "not_found"),
    (AccessRefused, "access_refused"),
    (ResourceLocked, "resource_locked"),
    (UnknownType, "command_invalid"),
    (NotSupported, "not_implemented"),
)


def declaration_refused(exc: ModelError) -> DefinitionsRefused:
    """A queue or exchange of the import refused, as RabbitMQ words it."""
    name = next((n for kind, n in REPLY_NAMES if isinstance(exc, kind)), "precondition_failed")
    text = f"{name}: {exc}"
    return DefinitionsRefused(text, text)


PER_VHOST = (
    "permissions",
    "topic_permissions",
    "parameters",
    "policies",
    "queues",
    "exchanges",
    "bindings",
)


def _vhost_metadata(vhost: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"description": vhost.description, "tags": vhost.tags}
    if vhost.default_queue_type:
        meta["default_queue_type"] = vhost.default_queue_type
    return meta


def export_definitions(broker: Broker, vhost: str | None = None) -> dict[str, Any]:
    """The whole broker, or one vhost. A vhost's export is RabbitMQ's: no users,
    vhosts or permissions, and its queues, exchanges and bindings without `vhost`
    (an import puts them into the vhost it is posted to)."""
    admin = broker.admin
    vhosts = [admin.vhost(vhost)] if vhost is not None else list(broker.vhosts.values())
    doc: dict[str, Any] = {"rabbit_version": "3.10.8"}
    if vhost is None:
        doc["rabbitmq_version"] = "3.10.8"
        doc["product_name"] = "Leveret"
        doc["product_version"] = leveret.__version__
        doc["users"] = [u.record() for u in sorted(broker.access.users.values(), key=_name)]
        doc["vhosts"] = [
            {"name": v.name, "metadata": _vhost_metadata(v)} for v in sorted(vhosts, key=_name)
        ]
        doc["permissions"] = admin.list_permissions()
        doc["topic_permissions"] = admin.list_topic_permissions()
    # vhost limits, shovels, federation upstreams and sets (broker.parameters), and
    # operator policies, which RabbitMQ keeps as parameters of component operator_policy
    doc["parameters"] = [
        p for v in sorted(vhosts, key=_name) for p in broker.parameters.list(v.name)
    ] + [
        {"vhost": v.name, "component": "operator_policy", "name": p.name, "value": _value(p)}
        for v in sorted(vhosts, key=_name)
        for p in sorted(v.operator_policies.values(), key=_name)
    ]
    if vhost is None:
        doc["global_parameters"] = broker.global_parameters.list()
    doc["policies"] = []
    for v in sorted(vhosts, key=_name):
        for policy in sorted(v.policies.values(), key=_name):
            doc["policies"].append({"vhost": v.name, **policy.record()})
    doc["queues"] = [
        {
            "name": q.name,
            "vhost": v.name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "arguments": _jsonable(q.arguments),
        }
        for v in sorted(vhosts, key=_name)
        for q in sorted(v.queues.values(), key=_name)
        if q.exclusive_owner is None
    ]
    doc["exchanges"] = [
        {
            "name": x.name,
            "vhost": v.name,
            "type": x.type_name,
            "durable": x.durable,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": _jsonable(x.arguments),
        }
        for v in sorted(vhosts, key=_name)
        for x in sorted(v.exchanges.values(), key=_name)
        if x.name and not x.name.startswith("amq.")
    ]
    doc["bindings"] = []
    for v in sorted(vhosts, key=_name):
        for x in sorted(v.exchanges.values(), key=_name):
            if not x.name:
                continue  # the default exchange's bindings are implicit
            for b in x.bindings.values():
                dest = b.destination
                is_queue = type(dest) is not type(x)
                if is_queue and getattr(dest, "exclusive_owner", None) is not None:
                    continue
                doc["bindings"].append(
                    {
                        "source": x.name,
                        "vhost": v.name,
                        "destination": dest.name,
                        "destination_type": "queue" if is_queue else "exchange",
                        "routing_key": b.routing_key,
                        "arguments": _jsonable(b.arguments),
                    }
                )
    if vhost is not None:
        for kind in ("queues", "exchanges", "bindings"):
            for item in doc[kind]:
                del item["vhost"]
    return doc


def _value(policy: Policy) -> dict[str, Any]:
    """An operator policy as the value of its parameter (RabbitMQ's form)."""
    record = policy.record()
    del record["name"]
    return record


def _name(item: Any) -> str:
    return item.name


def _jsonable(value: Any) -> Any:
    """AMQP field values as JSON: bytes become text, decimals and timestamps strings."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return utf8_safe(bytes(value))
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def utf8_safe(raw: bytes) -> str:
    """A longstr or byte array as RabbitMQ's management API shows it: its text when it
    is UTF-8, else `Not UTF-8, base64 is: ` and its base64, a newline after each whole
    76 characters (recorded: tests/compat/http, queues.get.arguments_not_utf8)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        encoded = base64.b64encode(raw).decode()
        full = len(encoded) - len(encoded) % 76
        # each whole line of 76 ends in a newline, the last one too
        lines = "".join(encoded[i : i + 76] + "\n" for i in range(0, full, 76))
        return "Not UTF-8, base64 is: " + lines + encoded[full:]


def json_arguments(value: Any) -> Any:
    """Arguments from JSON (the management API, a definitions import) with the field
    types RabbitMQ gives them: every integer a long. Clients see the type: a binding's
    types are part of its identity (only an unbind with the value as a long removes a
    binding the management API made), and a queue redeclared without an argument, or
    refused for an argument's type, is told the type by name ("current is the value
    '10' of type 'long'", "{unacceptable_type,long}"; recorded: tests/compat/amqp
    argtypes.http_* and argtypes.definitions_*)."""
    if isinstance(value, dict):
        return {k: json_arguments(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_arguments(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return Long(value)
    return value


def _default_algorithm(doc: dict[str, Any]) -> str:
    """The hashing algorithm of a user without one: RabbitMQ before 3.6 hashed with MD5
    and its exports name no algorithm, so a file from such a version means MD5."""
    version = doc.get("rabbit_version") or doc.get("rabbitmq_version")
    try:
        major_minor = tuple(int(p) for p in str(version).split(".")[:2])
    except ValueError:
        major_minor = ()
    if len(major_minor) == 2 and major_minor < (3, 6):
        return "rabbit_password_hashing_md5"
    return passwords.DEFAULT_ALGORITHM


def _check(doc: Any, vhost: str | None) -> None:
    """Every problem is found before anything changes."""
    if not isinstance(doc, dict):
        raise InvalidValue("definitions must be a JSON object")
    for key, value in doc.items():
        if key not in TOP_LEVEL:
            raise InvalidValue(
                f"unknown key '{key}' in definitions; known keys: " + ", ".join(sorted(TOP_LEVEL))
            )
        if not isinstance(value, TOP_LEVEL[key]):
            raise InvalidValue(f"'{key}' must be a {TOP_LEVEL[key].__name__}")
    for section, (known, required) in ITEM_KEYS.items():
        for i, item in enumerate(doc.get(section, [])):
            where = f"{section}[{i}]"
            if not isinstance(item, dict):
                raise InvalidValue(f"{where} must be an object")
            for key in item:
                if key not in known:
                    raise InvalidValue(
                        f"unknown key '{key}' in {where}; known keys: " + ", ".join(sorted(known))
                    )
            missing = sorted(required - item.keys() - ({"vhost"} if vhost else set()))
            if missing:
                raise InvalidValue(f"{where} lacks '{missing[0]}'")
            for key in ("name", "user", "vhost", "source", "destination", "exchange"):
                if key in item and not isinstance(item[key], str):
                    raise InvalidValue(f"{where}.{key} must be a string")
            for key in ("durable", "auto_delete", "internal"):
                # A string such as "false" would read as true; RabbitMQ refuses it too.
                if section in ("queues", "exchanges") and key in item:
                    if not isinstance(item[key], bool):
                        shown = json.dumps(item[key])
                        raise InvalidValue(f"{where}.{key} must be true or false, got {shown}")
    for i, user in enumerate(doc.get("users", [])):
        where = f"users[{i}]"
        try:
            if "password" not in user:
                passwords.validate_hash(
                    user.get("password_hash", ""),
                    user.get("hashing_algorithm", _default_algorithm(doc)),
                )
            parse_tags(user.get("tags", []))
            check_user_limits(user.get("limits") or {})
        except InvalidValue as exc:
            raise InvalidValue(f"{where}: {exc}") from None
    for i, perm in enumerate(doc.get("permissions", [])):
        try:
            Permission(
                perm["user"],
                perm.get("vhost", vhost or ""),
                perm.get("configure", ""),
                perm.get("write", ""),
                perm.get("read", ""),
            )
        except InvalidValue as exc:
            raise InvalidValue(f"permissions[{i}]: {exc}") from None
    for i, topic in enumerate(doc.get("topic_permissions", [])):
        try:
            TopicPermission(
                topic["user"],
                topic.get("vhost", vhost or ""),
                topic["exchange"],
                topic.get("write", ""),
                topic.get("read", ""),
            )
        except InvalidValue as exc:
            raise InvalidValue(f"topic_permissions[{i}]: {exc}") from None
    for i, item in enumerate(doc.get("policies", [])):
        try:
            Policy(
                item["name"],
                item["pattern"],
                item["definition"],
                item.get("priority", 0),
                item.get("apply-to", "all"),
            )
        except InvalidValue as exc:
            raise InvalidValue(f"policies[{i}]: {exc}") from None
    for i, param in enumerate(doc.get("global_parameters", [])):
        try:
            check_value(param["name"], param["value"])
        except InvalidValue as exc:
            raise InvalidValue(f"global_parameters[{i}]: {exc}") from None
    for i, param in enumerate(doc.get("parameters", [])):
        if param["component"] == "vhost-limits" and not isinstance(param["value"], dict):
            raise InvalidValue(f"parameters[{i}].value must be an object")
    for i, binding in enumerate(doc.get("bindings", [])):
        if binding["destination_type"] not in ("queue", "exchange"):
            raise InvalidValue(f"bindings[{i}].destination_type must be 'queue' or 'exchange'")


def import_definitions(
    broker: Broker, doc: Any, vhost: str | None = None, user: str | None = None
) -> dict[str, int]:
    """Create or update everything in `doc`; with `vhost`, every item goes into that vhost.
    `user` imports it: new exchanges name them as who declared them (the API's
    `user_who_performed_action`)."""
    _check(doc, vhost)
    _check_parameters(broker, doc, vhost)
    admin = broker.admin

    def vh(item: dict[str, Any]) -> str:
        return vhost if vhost is not None else item["vhost"]

    counts: dict[str, int] = {}
    if vhost is not None:
        admin.vhost(vhost)
    known_vhosts = set(broker.vhosts) | {v["name"] for v in doc.get("vhosts", [])}
    known_users = set(broker.access.users) | {u["name"] for u in doc.get("users", [])}
    for section in PER_VHOST:
        for i, item in enumerate(doc.get(section, [])):
            if vh(item) not in known_vhosts:
                raise DefinitionsRefused(
                    f"{section}[{i}]: vhost '{vh(item)}' does not exist",
                    ["no_such_vhost", vh(item)],
                )
            if "user" in item and item["user"] not in known_users:
                raise DefinitionsRefused(
                    f"{section}[{i}]: user '{item['user']}' does not exist",
                    ["no_such_user", item["user"]],
                )
    for item in doc.get("vhosts", []):
        meta = item.get("metadata") or {}
        admin.add_vhost(
            item["name"],
            meta.get("description", item.get("description", "")),
            meta.get("tags", item.get("tags", [])) or [],
            exist_ok=True,
            default_queue_type=meta.get("default_queue_type", item.get("default_queue_type")),
        )
        if item.get("limits"):
            admin.set_vhost_limits(item["name"], item["limits"])
    for item in doc.get("users", []):
        tags = item.get("tags", [])
        if "password" in item:
            admin.add_user(item["name"], item["password"], tags, replace=True)
        else:
            admin.add_user(
                item["name"],
                None,
                tags,
                password_hash=item.get("password_hash", ""),
                hashing_algorithm=item.get("hashing_algorithm", _default_algorithm(doc)),
                replace=True,
            )
        if "limits" in item:  # RabbitMQ keeps per-user limits in the user's record
            admin.set_user_limits(item["name"], item["limits"] or {}, replace=True)
    # As RabbitMQ: internal_cluster_id and cluster_name too (an export of another
    # broker gives this one its name and id); a vhost's import leaves them alone.
    for item in doc.get("global_parameters", []) if vhost is None else []:
        broker.global_parameters.set(item["name"], item["value"])
    for item in doc.get("permissions", []):
        admin.set_permissions(
            item["user"],
            vh(item),
            item.get("configure", ""),
            item.get("write", ""),
            item.get("read", ""),
        )
    for item in doc.get("topic_permissions", []):
        admin.set_topic_permissions(
            item["user"], vh(item), item["exchange"], item.get("write", ""), item.get("read", "")
        )
    for item in doc.get("parameters", []):
        if item["component"] == "vhost-limits":
            admin.set_vhost_limits(vh(item), item["value"])
        elif item["component"] == "operator_policy":
            value = item["value"]
            admin.set_operator_policy(
                vh(item),
                item["name"],
                value["pattern"],
                value["definition"],
                value.get("priority", 0),
                value.get("apply-to", "queues"),
            )
        else:
            broker.parameters.set(vh(item), item["component"], item["name"], item["value"])
    for item in doc.get("policies", []):
        admin.set_policy(
            vh(item),
            item["name"],
            item["pattern"],
            item["definition"],
            item.get("priority", 0),
            item.get("apply-to", "all"),
        )
    for kind in ("exchanges", "queues", "bindings"):
        for item in doc.get(kind, []):
            try:
                if broker.meta is not None:  # one of several workers: through the writer
                    broker.meta.import_item(admin.vhost(vh(item)), kind, item, user)
                else:
                    _declare(admin.vhost(vh(item)), kind, item, user)
            except ModelError as exc:
                raise declaration_refused(exc) from None
    for section in TOP_LEVEL:
        if isinstance(doc.get(section), list):
            counts[section] = len(doc[section])
    return counts


def _check_parameters(broker: Broker, doc: dict[str, Any], vhost: str | None) -> None:
    """Shovels and federation upstreams are checked as the API checks them, first."""
    known = broker.parameters.validators
    for i, param in enumerate(doc.get("parameters", [])):
        component = param["component"]
        if component == "vhost-limits":
            continue
        if component == "operator_policy":
            _check_operator_policy(i, param)
            continue
        if component not in known:
            raise InvalidValue(
                f"parameters[{i}]: component '{component}' is not supported (Leveret knows "
                + ", ".join(["vhost-limits", "operator_policy", *sorted(known)])
                + ")"
            )
        where = vhost if vhost is not None else param["vhost"]
        problems = known[component](broker, where, param["name"], param["value"], None)
        if problems:
            raise InvalidValue(
                f"parameters[{i}] ({component} '{param['name']}'): " + "; ".join(problems)
            )


def _check_operator_policy(i: int, param: dict[str, Any]) -> None:
    """An operator policy parameter, checked before anything changes."""
    value = param["value"]
    if not isinstance(value, dict) or not {"pattern", "definition"} <= value.keys():
        raise InvalidValue(
            f"parameters[{i}] (operator_policy '{param['name']}'): the value needs "
            "pattern and definition"
        )
    try:
        Policy(
            param["name"],
            value["pattern"],
            value["definition"],
            value.get("priority", 0),
            value.get("apply-to", "queues"),
            operator=True,
        )
    except InvalidValue as exc:
        raise InvalidValue(f"parameters[{i}]: {exc}") from None


def _declare(target: Any, kind: str, item: dict[str, Any], user: str | None = None) -> None:
    if not wanted(target, kind, item):
        return
    arguments = json_arguments(item.get("arguments") or {})
    if kind == "exchanges":
        target.declare_exchange(
            item["name"],
            item["type"],
            False,
            bool(item.get("durable", True)),
            bool(item.get("auto_delete", False)),
            bool(item.get("internal", False)),
            arguments,
            **({"user": user} if user is not None else {}),
        )
    elif kind == "queues":
        if item.get("type") and "x-queue-type" not in arguments:
            arguments = {**arguments, "x-queue-type": item["type"]}
        target.declare_queue(
            item["name"],
            False,
            bool(item.get("durable", True)),
            False,
            bool(item.get("auto_delete", False)),
            arguments,
        )
    else:
        source = target.exchanges[item["source"]]
        if item["destination_type"] == "queue":
            dest = target.queues[item["destination"]]
        else:
            dest = target.exchanges[item["destination"]]
        target.bind(source, dest, item.get("routing_key", ""), arguments)


def wanted(target: Any, kind: str, item: dict[str, Any]) -> bool:
    """Whether the import makes this item in vhost `target`, as RabbitMQ 3.10 decides:
    not a queue or exchange that exists (it keeps its type, flags and arguments, and a
    bad argument or type in the file is not looked at), nor a binding whose source or
    destination is missing (skipped, not refused)."""
    if kind == "exchanges":
        return item["name"] not in target.exchanges
    if kind == "queues":
        return item["name"] not in target.queues
    destinations = target.queues if item["destination_type"] == "queue" else target.exchanges
    return item["source"] in target.exchanges and item["destination"] in destinations
