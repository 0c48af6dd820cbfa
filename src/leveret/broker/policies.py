"""Policies and operator policies, RabbitMQ's model.

A policy names queues and/or exchanges by a regular expression and gives them
settings (a "definition") without touching their declared arguments. For each
queue or exchange the matching policy with the highest priority applies (one
user policy and one operator policy at a time). As RabbitMQ's classic queues
resolve them: for the limits (expires, message-ttl, max-length,
max-length-bytes) the lowest of argument, policy and operator policy wins; for
the rest (overflow, dead-lettering, queue-mode) the queue's own argument wins.

A definition is turned into the x-arguments it stands for, so one parser
(broker.queue_args) validates and interprets both, and a policy can do nothing
an argument could not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from leveret.broker.errors import InvalidValue
from leveret.broker.queue_args import parse_queue_arguments
from leveret.protocol.errors import ChannelError

# policy key → the queue argument it stands for
QUEUE_KEYS = {
    "message-ttl": "x-message-ttl",
    "expires": "x-expires",
    "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    "queue-mode": "x-queue-mode",
    "max-age": "x-max-age",
}
EXCHANGE_KEYS = {"alternate-exchange": "alternate-exchange"}
# Operator policies may only cap resources (RabbitMQ's list, less what Leveret lacks).
OPERATOR_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes")
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "streams")


@dataclass
class Policy:
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"
    operator: bool = False
    regex: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        what = "operator policy" if self.operator else "policy"
        if not isinstance(self.name, str) or not self.name:
            raise InvalidValue(f"{what} name must be a non-empty string")
        if not isinstance(self.pattern, str):
            raise InvalidValue(f"{what} '{self.name}': pattern must be a string")
        try:
            self.regex = re.compile(self.pattern)
        except re.error as exc:
            raise InvalidValue(
                f"{what} '{self.name}': invalid regular expression '{self.pattern}': {exc}"
            ) from None
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InvalidValue(f"{what} '{self.name}': priority must be an integer")
        if self.apply_to not in APPLY_TO:
            raise InvalidValue(
                f"{what} '{self.name}': apply-to '{self.apply_to}' is not one of "
                + ", ".join(APPLY_TO)
            )
        self._check_definition(what)

    def _check_definition(self, what: str) -> None:
        definition = self.definition
        if not isinstance(definition, dict) or not definition:
            raise InvalidValue(f"{what} '{self.name}': definition must be a non-empty object")
        allowed = OPERATOR_KEYS if self.operator else (*QUEUE_KEYS, *EXCHANGE_KEYS)
        for key in definition:
            if key not in allowed:
                raise InvalidValue(
                    f"{what} '{self.name}': '{key}' is not a recognised {what} setting; "
                    "known: " + ", ".join(allowed)
                )
        ae = definition.get("alternate-exchange")
        if ae is not None and not isinstance(ae, str):
            raise InvalidValue(f"{what} '{self.name}': alternate-exchange must be a string")
        if "max-age" in definition and not isinstance(definition["max-age"], str):
            raise InvalidValue(f"{what} '{self.name}': max-age must be a string such as '7D'")
        arguments = {QUEUE_KEYS[k]: v for k, v in definition.items() if k in QUEUE_KEYS}
        arguments.pop("x-max-age", None)
        if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
            arguments["x-dead-letter-exchange"] = ""  # a routing key alone is fine in a policy
        try:
            parse_queue_arguments(arguments, f"{what} '{self.name}'")
        except ChannelError as exc:
            text = exc.reply_text.partition(" - ")[2] or exc.reply_text
            text = text.replace("invalid arg 'x-", "invalid value for '")
            raise InvalidValue(text) from None

    def applies_to(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        """kind: 'queue' or 'exchange'."""
        a = self.apply_to
        if kind == "exchange":
            if a not in ("all", "exchanges"):
                return False
        elif a == "exchanges" or (a == "classic_queues" and queue_type != "classic"):
            return False
        elif a == "streams" and queue_type != "stream":
            return False
        return self.regex.search(name) is not None

    def record(self) -> dict[str, Any]:
        """RabbitMQ's JSON for a policy (definitions export, ctl listings)."""
        return {
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": self.definition,
            "priority": self.priority,
        }


def winner(policies: dict[str, Policy], kind: str, name: str, queue_type: str) -> Policy | None:
    """The matching policy with the highest priority (ties: the first name in order)."""
    best = None
    for policy in sorted(policies.values(), key=lambda p: p.name):
        if policy.applies_to(kind, name, queue_type) and (
            best is None or policy.priority > best.priority
        ):
            best = policy
    return best


def effective_queue_arguments(
    arguments: dict[str, Any], policy: Policy | None, operator: Policy | None
) -> dict[str, Any]:
    """The arguments a queue behaves by: its own, then the policy's, capped by the operator's."""
    merged = dict(arguments)
    if policy is not None:
        for key, value in policy.definition.items():
            arg = QUEUE_KEYS.get(key)
            if arg is None:
                continue
            if arg not in arguments:
                merged[arg] = value
            elif key in OPERATOR_KEYS and _lower(value, arguments[arg]):
                merged[arg] = value  # limits: the lower of argument and policy, as RabbitMQ
        if "x-dead-letter-routing-key" in merged and "x-dead-letter-exchange" not in merged:
            del merged["x-dead-letter-routing-key"]  # meaningless without a DLX
    if operator is not None:
        for key, value in operator.definition.items():
            arg = QUEUE_KEYS[key]
            if arg not in merged or _lower(value, merged[arg]):
                merged[arg] = value
    return merged


def _lower(value: Any, current: Any) -> bool:
    """True when `value` is a lower limit than `current` (a non-integer never is)."""
    if not isinstance(current, int) or isinstance(current, bool):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value < current
