"""Policies and operator policies, RabbitMQ's model.

A policy names queues and/or exchanges by a regular expression and gives them
settings (a "definition") without touching their declared arguments. For each
queue or exchange the matching policy with the highest priority applies (one
user policy and one operator policy at a time). As RabbitMQ resolves them: for
the limits (expires, message-ttl, max-length, max-length-bytes, and a stream's
max-age and segment size) the lowest of argument, policy and operator policy
wins; for the rest (overflow, dead-lettering, queue-mode, alternate-exchange)
the declared argument wins.

A definition stands for x-arguments, so a queue's effective settings are its
arguments merged with its policies (effective_queue_arguments), read by the
same parser (broker.queue_args) as a declaration: a policy can do nothing an
argument could not. Declared arguments stay as declared, so redeclaration
equivalence compares them alone, as in RabbitMQ.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leveret.broker.erlang_terms import proplist, string, term
from leveret.broker.errors import InvalidValue
from leveret.broker.queue_args import DEAD_LETTER_STRATEGIES, OVERFLOW_MODES, QUEUE_MODES
from leveret.broker.queues.stream import parse_age


class PolicyError(InvalidValue, ValueError):
    """A policy refused when it is set; the text says which field and why.

    `rabbit` is the reason in RabbitMQ's words (values printed as Erlang terms, as its
    HTTP API and rabbitmqctl answer), without the policy's name."""

    def __init__(self, message: str, rabbit: str | None = None) -> None:
        super().__init__(message)
        self.rabbit = rabbit if rabbit is not None else message


def _is_int(value: Any, minimum: int | None = None) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return minimum is None or value >= minimum


def _integer(minimum: int, what: str) -> Callable[[Any], str | None]:
    return lambda v: None if _is_int(v, minimum) else f"{_show(v)} is not a valid {what}"


def _string(what: str) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, str) else f"{_show(v)} is not a valid {what}"


def _one_of(choices: tuple[str, ...], what: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"{_show(v)} is not a valid {what}"


def _age(value: Any) -> str | None:
    return None if parse_age(value) is not None else f"{_show(value)} is not a valid max age"


# policy key → (the queue argument it stands for, its check). Texts: RabbitMQ 3.10's.
QUEUE_KEYS: dict[str, tuple[str, Callable[[Any], str | None]]] = {
    "message-ttl": ("x-message-ttl", _integer(0, "message TTL")),
    "expires": ("x-expires", _integer(1, "queue expiry")),
    "max-length": ("x-max-length", _integer(0, "maximum length")),
    "max-length-bytes": ("x-max-length-bytes", _integer(0, "maximum length in bytes")),
    "overflow": ("x-overflow", _one_of(OVERFLOW_MODES, "overflow value")),
    "dead-letter-exchange": ("x-dead-letter-exchange", _string("dead letter exchange name")),
    "dead-letter-routing-key": ("x-dead-letter-routing-key", _string("dead letter routing key")),
    "queue-mode": ("x-queue-mode", _one_of(QUEUE_MODES, "queue-mode value")),
    "max-age": ("x-max-age", _age),
    "stream-max-segment-size-bytes": (
        "x-stream-max-segment-size-bytes",
        _integer(0, "segment size"),
    ),
    # Quorum queues' settings (classic queues and streams ignore them, as RabbitMQ's do).
    "dead-letter-strategy": (
        "x-dead-letter-strategy",
        _one_of(DEAD_LETTER_STRATEGIES, "dead letter strategy"),
    ),
    "delivery-limit": ("x-delivery-limit", _integer(0, "delivery limit")),
    "max-in-memory-length": ("x-max-in-memory-length", _integer(0, "maximum memory in bytes")),
    "max-in-memory-bytes": ("x-max-in-memory-bytes", _integer(0, "maximum memory in bytes")),
}
EXCHANGE_KEYS: dict[str, Callable[[Any], str | None]] = {
    "alternate-exchange": _string("alternate exchange name"),
}
# What RabbitMQ lets an operator policy set: caps on resources only.
OPERATOR_KEYS = (
    "expires",
    "message-ttl",
    "max-length",
    "max-length-bytes",
    "delivery-limit",
    "max-in-memory-length",
    "max-in-memory-bytes",
)
# Settings where the lowest of argument, policy and operator policy wins (RabbitMQ's min).
LOWEST_WINS = (*OPERATOR_KEYS, "max-age", "stream-max-segment-size-bytes")
APPLY_TO = ("queues", "exchanges", "all", "classic_queues", "quorum_queues", "streams")
# Keys that other parts of Leveret act on (federation's upstream keys), each with a
# check of the whole definition, as RabbitMQ's plugins register policy validators;
# leveret.links.register() adds them when a Broker is made.
EXTRA_KEYS: dict[str, Callable[[dict[str, Any]], str | None]] = {}


def _show(value: Any) -> str:
    """A value as the client sent it (JSON), for error texts."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


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
            raise PolicyError(f"{what} name must be a non-empty string")

        def fail(reason: str, rabbit: str | None = None) -> PolicyError:
            return PolicyError(f"{what} '{self.name}': {reason}", rabbit or reason)

        if not isinstance(self.pattern, str):
            raise fail(
                f"pattern should be a string but was {_show(self.pattern)}",
                f"pattern should be a binary but was {term(self.pattern)}",
            )
        try:
            self.regex = re.compile(self.pattern)  # once, when set; never per lookup
        except re.error as exc:
            raise fail(
                f"invalid regular expression '{self.pattern}': {exc}",
                "pattern should be regular expression but is invalid: "
                f"{{{string(exc.msg)},{exc.pos or 0}}}",
            ) from None
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise fail(
                f"priority should be a number, actually was {_show(self.priority)}",
                f"priority should be a number, actually was {term(self.priority)}",
            )
        if self.apply_to not in APPLY_TO:
            raise fail(
                f"apply-to '{self.apply_to}' unrecognised; should be "
                + ", ".join(f"'{a}'" for a in APPLY_TO[:-1])
                + f" or '{APPLY_TO[-1]}'"
            )
        if not isinstance(self.definition, dict):
            raise fail(f"definition should be an object but was {_show(self.definition)}")
        if not self.definition:
            raise fail("no policy provided")
        allowed = OPERATOR_KEYS if self.operator else (*QUEUE_KEYS, *EXCHANGE_KEYS, *EXTRA_KEYS)
        unknown = [key for key in self.definition if key not in allowed]
        if unknown:
            names = ", ".join(f"'{key}'" for key in unknown)
            verb = "is not a recognised" if len(unknown) == 1 else "are not recognised"
            noun = f"{what} setting" + ("" if len(unknown) == 1 else "s")
            raise fail(
                f"{names} {verb} {noun}; known: " + ", ".join(allowed),
                proplist({k: self.definition[k] for k in unknown})
                + " are not recognised policy settings",
            )
        for check_all in {EXTRA_KEYS[k] for k in self.definition if k in EXTRA_KEYS}:
            reason = check_all(self.definition)
            if reason is not None:  # in RabbitMQ's words, as its plugins answer
                raise PolicyError(f"Validation failed\n\n{reason}\n", reason)
        for key, value in self.definition.items():
            if key in EXTRA_KEYS:
                continue
            check = QUEUE_KEYS[key][1] if key in QUEUE_KEYS else EXCHANGE_KEYS[key]
            reason = check(value)
            if reason is not None:
                # Each check's text starts with the value: RabbitMQ prints it as a term.
                raise fail(reason, reason.replace(_show(value), term(value), 1))

    def applies_to(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        """kind: 'queue' or 'exchange'."""
        a = self.apply_to
        if kind == "exchange":
            if a not in ("all", "exchanges"):
                return False
        elif a == "exchanges" or (a == "classic_queues" and queue_type != "classic"):
            return False
        elif a == "quorum_queues" and queue_type != "quorum":
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
    """The matching policy with the highest priority.

    Ties go to the first name in code-point order. RabbitMQ leaves ties to the
    order of its internal table, so no rule can match it; this one is stable.
    """
    best = None
    for policy in sorted(policies.values(), key=lambda p: p.name):
        if policy.applies_to(kind, name, queue_type) and (
            best is None or policy.priority > best.priority
        ):
            best = policy
    return best


def effective_queue_arguments(
    arguments: dict[str, Any],
    policy: Policy | None,
    operator: Policy | None,
    policy_wins: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The arguments a queue behaves by: its own, then the policy's, capped by the operator's.

    `policy_wins` names the keys where the policies' value (the lower of the two, for a
    limit) replaces the argument: a quorum queue's overflow and expires, in RabbitMQ."""
    merged = dict(arguments)
    if policy is not None:
        for key, value in policy.definition.items():
            if key not in QUEUE_KEYS:
                continue
            arg = QUEUE_KEYS[key][0]
            if arg not in arguments or (key in LOWEST_WINS and _lower(key, value, arguments[arg])):
                merged[arg] = value
        if "x-dead-letter-routing-key" in merged and "x-dead-letter-exchange" not in merged:
            del merged["x-dead-letter-routing-key"]  # meaningless without a DLX
    if operator is not None:
        for key, value in operator.definition.items():
            arg = QUEUE_KEYS[key][0]
            if arg not in merged or _lower(key, value, merged[arg]):
                merged[arg] = value
    for key in policy_wins:
        mine = policy.definition.get(key) if policy is not None else None
        theirs = operator.definition.get(key) if operator is not None else None
        if mine is None and theirs is None:
            continue
        if mine is None or (theirs is not None and _lower(key, theirs, mine)):
            mine = theirs
        merged[QUEUE_KEYS[key][0]] = mine
    return merged


def _lower(key: str, value: Any, current: Any) -> bool:
    """True when `value` is a tighter limit than `current` (a malformed current never holds)."""
    if key == "max-age":
        new, old = parse_age(value), parse_age(current)
        return old is None or (new is not None and new < old)
    if not _is_int(current):
        return True
    return _is_int(value) and value < current
