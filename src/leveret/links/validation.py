"""Validation of shovel and federation parameters, with RabbitMQ 3.10's rules and texts.

RabbitMQ checks a parameter against a list of (key, check, mandatory) and
reports every problem, newest check first, after "Unrecognised terms" (keys it
does not know). These functions return the same texts in the same order; the
management API, `leveret ctl` and definitions imports show them as RabbitMQ's
"Validation failed" list (broker.parameters.ParameterError).

Leveret is stricter in a few places where RabbitMQ accepts a definition that
can never run (a negative or fractional prefetch count, an empty URI list, a
value that is not an object): those get a 400 too, with a plain sentence
(docs/differences.md#plugins-stricter-validation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.erlang_terms import binary, proplist, term
from leveret.links import uris

if TYPE_CHECKING:
    from leveret.auth.users import User
    from leveret.broker.broker import Broker

Check = Callable[[str, Any], "str | None"]

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PUBLISH_PROPERTIES_STR = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
PUBLISH_PROPERTIES_NUM = ("delivery_mode", "priority", "timestamp")


# --- RabbitMQ's rabbit_parameter_validation --------------------------------------


def number(key: str, value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None
    return f"{key} should be a number, actually was {term(value)}"


def text(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {term(value)}"


def boolean(key: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    return f"{key} should be boolean, actually was {term(value)}"


def queue_name(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{key} should be binary, actually was {term(value)}"
    size = len(value.encode())
    if size > 255:
        return f"{key} should be less than 255 bytes, actually was {size}"
    return None


def enum(options: tuple[str, ...]) -> Check:
    shown = "[" + ",".join(binary(o) for o in options) + "]"

    def check(key: str, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{key} should be binary, actually was {term(value)}"
        if value in options:
            return None
        return f"{key} should be one of {shown}, actually was {term(value)}"

    return check


def table(key: str, value: Any) -> str | None:
    """Queue and consumer arguments: an object (RabbitMQ checks each argument later)."""
    if isinstance(value, dict):
        return None
    return f"{key} not a list {term(value)}"


def uri_list(key: str, value: Any) -> str | None:
    """One URI or a list of them; the first bad one is reported."""
    if isinstance(value, str):
        return uris.check(value)
    if not isinstance(value, list):
        return f"{key} should be list, actually was {term(value)}"
    for item in value:
        problem = uri_list(key, item) if isinstance(item, str) else text(key, item)
        if problem:
            return problem
    return None


def delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    return (
        f'{key} should be a number greater than or equal to 0, "never" or '
        f'"queue-length", actually was {term(value)}'
    )


def publish_properties(key: str, value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"{key} not a list {term(value)}"
    checks: list[tuple[str, Check, bool]] = [
        (p, number if p in PUBLISH_PROPERTIES_NUM else text, False)
        for p in (
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "type",
            "user_id",
            "app_id",
            "cluster_id",
        )
    ]
    problems = check_proplist(key, checks, value)
    return "\n".join(problems) if problems else None


def check_proplist(name: str, checks: list[tuple[str, Check, bool]], value: dict) -> list[str]:
    """rabbit_parameter_validation:proplist: problems newest first, unknown keys before them."""
    problems: list[str] = []
    seen = set()
    for key, check, mandatory in checks:
        if key in value:
            seen.add(key)
            problem = check(key, value[key])
            if problem:
                problems.insert(0, problem)
        elif mandatory:
            problems.insert(0, f'Key "{key}" not found in {name}')
    unknown = {k: v for k, v in value.items() if k not in seen}
    if unknown:
        problems.insert(0, f"Unrecognised terms {proplist(unknown)} in {name}")
    return problems


# --- shovels ------------------------------------------------------------------------


SHOVEL_CHECKS: list[tuple[str, Check, bool]] = [
    ("reconnect-delay", number, False),
    ("ack-mode", enum(ACK_MODES), False),
    ("src-protocol", enum(("amqp10", "amqp091")), False),
    ("dest-protocol", enum(("amqp10", "amqp091")), False),
    ("src-uri", uri_list, True),
    ("src-exchange", text, False),
    ("src-exchange-key", text, False),
    ("src-queue", text, False),
    ("src-queue-args", table, False),
    ("src-consumer-args", table, False),
    ("prefetch-count", number, False),
    ("src-prefetch-count", number, False),
    ("delete-after", delete_after, False),
    ("src-delete-after", delete_after, False),
    ("dest-uri", uri_list, True),
    ("dest-exchange", text, False),
    ("dest-exchange-key", text, False),
    ("dest-queue", queue_name, False),
    ("dest-queue-args", table, False),
    ("add-forward-headers", boolean, False),
    ("add-timestamp-header", boolean, False),
    ("dest-add-forward-headers", boolean, False),
    ("dest-add-timestamp-header", boolean, False),
    ("publish-properties", publish_properties, False),
    ("dest-publish-properties", publish_properties, False),
]


def shovel(
    broker: Broker | None, vhost: str, name: str, value: Any, user: User | None = None
) -> list[str]:
    """Every problem with a shovel's definition (empty: valid)."""
    if not isinstance(value, dict):
        return [f"a shovel's value must be a JSON object, got {term(value)}"]
    problems: list[str] = []
    src_q, src_x = "src-queue" in value, "src-exchange" in value
    if not src_q and not src_x:
        problems.append("Must specify 'src-exchange' or 'src-queue'")
    elif src_q and src_x:
        problems.append("Cannot specify 'src-exchange' and 'src-queue'")
    after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(after, int) and not isinstance(after, bool) and value.get("ack-mode") == "no-ack":
        problems.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        problems.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    problems += check_proplist(name, SHOVEL_CHECKS, value)
    if problems:
        return problems
    # What RabbitMQ accepts but could never run (Leveret's own sentences).
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key, "amqp091") != "amqp091":
            problems.append(f"{key} {value[key]}: Leveret's shovels speak AMQP 0-9-1 only")
    for key in ("src-prefetch-count", "prefetch-count"):
        count = value.get(key)
        if count is not None and not (isinstance(count, int) and 0 <= count <= 65535):
            problems.append(f"{key} must be a whole number from 0 to 65535, got {term(count)}")
    delay = value.get("reconnect-delay")
    if delay is not None and delay < 0:
        problems.append(f"reconnect-delay must not be negative, got {term(delay)}")
    for key in ("src-uri", "dest-uri"):
        if value[key] == []:
            problems.append(f"{key} must name at least one URI")
    for key in ("publish-properties", "dest-publish-properties"):
        props = value.get(key) or {}
        mode = props.get("delivery_mode")
        if mode is not None and mode not in (1, 2):
            problems.append(f"{key}: delivery_mode must be 1 or 2, got {term(mode)}")
    if problems:
        return problems
    if broker is not None and user is not None:
        for key in ("src-uri", "dest-uri"):
            problem = _direct_access(broker, value[key], user)
            if problem:
                return [problem]
    return []


def _direct_access(broker: Broker, uri_value: Any, user: User) -> str | None:
    """A direct URI (this broker) needs the defining user to have access to its vhost."""
    for uri in [uri_value] if isinstance(uri_value, str) else uri_value:
        parsed = uris.parse(uri)
        if not parsed.direct:
            continue
        vhost = parsed.vhost
        if vhost not in broker.vhosts or broker.access.permission(user.name, vhost) is None:
            return f'user "{user.name}" may not connect to vhost "{vhost}"'
    return None


# --- federation ---------------------------------------------------------------------------


SHARED_CHECKS: list[tuple[str, Check, bool]] = [
    ("exchange", text, False),
    ("queue", text, False),
    ("consumer-tag", text, False),
    ("prefetch-count", number, False),
    ("reconnect-delay", number, False),
    ("max-hops", number, False),
    ("expires", number, False),
    ("message-ttl", number, False),
    ("trust-user-id", boolean, False),
    ("ack-mode", enum(ACK_MODES), False),
    ("resource-cleanup-mode", enum(("default", "never")), False),
    ("ha-policy", text, False),
    ("bind-nowait", boolean, False),
    ("channel-use-mode", enum(("multiple", "single")), False),
]


def _upstream_extra(value: dict) -> list[str]:
    """Leveret's own checks of values RabbitMQ would accept and fail on later."""
    problems = []
    for key, low in (("prefetch-count", 0), ("max-hops", 1), ("expires", 1), ("message-ttl", 0)):
        got = value.get(key)
        if got is not None and not (isinstance(got, int) and got >= low):
            problems.append(f"{key} must be a whole number of at least {low}, got {term(got)}")
    if value.get("prefetch-count", 0) > 65535:
        problems.append("prefetch-count must be at most 65535")
    delay = value.get("reconnect-delay")
    if delay is not None and delay < 0:
        problems.append(f"reconnect-delay must not be negative, got {term(delay)}")
    if value.get("uri") == []:
        problems.append("uri must name at least one URI")
    return problems


def upstream(
    broker: Broker | None, vhost: str, name: str, value: Any, user: User | None = None
) -> list[str]:
    if not isinstance(value, dict):
        return [f"a federation upstream's value must be a JSON object, got {term(value)}"]
    problems = check_proplist(name, [("uri", uri_list, True), *SHARED_CHECKS], value)
    return problems or _upstream_extra(value)


def upstream_set(
    broker: Broker | None, vhost: str, name: str, value: Any, user: User | None = None
) -> list[str]:
    if not isinstance(value, list):
        return [f"federation-upstream-set should be list, actually was {term(value)}"]
    problems: list[str] = []
    for item in value:
        if not isinstance(item, dict):
            problems.append(f"{name} not a list {term(item)}")
            continue
        found = check_proplist(name, [("upstream", text, True), *SHARED_CHECKS], item)
        problems += found or _upstream_extra(item)
    return problems


# --- policies -------------------------------------------------------------------------------

POLICY_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


def policy(definition: dict[str, Any]) -> str | None:
    """RabbitMQ's check of the federation keys of a policy definition."""
    keys = [k for k in POLICY_KEYS if k in definition]
    if len(keys) >= 2:
        return (
            "cannot specify federation-upstream, federation-upstream-set "
            "or federation-upstream-pattern together"
        )
    if not keys:
        return None
    key, value = keys[0], definition[keys[0]]
    noun = {
        "federation-upstream": "federation upstream name",
        "federation-upstream-set": "federation upstream set name",
        "federation-upstream-pattern": "federation upstream pattern name",
    }[key]
    if not isinstance(value, str):
        return f"{term(value)} is not a valid {noun}"
    if key == "federation-upstream-pattern":
        import re

        try:
            re.compile(value)
        except re.error as exc:
            return f"could not compile pattern {value} to a regular expression. Error: {exc}"
    return None
