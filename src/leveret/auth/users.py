"""Users, their permissions and topic permissions, and the registry that holds them.

RabbitMQ's model: a user has tags and a password hash; per vhost it has three
regular expressions (configure, write, read) matched against resource names,
and per topic exchange two more (write, read) matched against routing keys.
Expressions are compiled once, when set; a bad one is refused then, not when
it is used. An empty expression matches nothing, as in RabbitMQ.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from leveret.auth import passwords
from leveret.broker.errors import InvalidValue

USER_LIMITS = ("max-connections", "max-channels")
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")
ANYTHING = ".*"


def compile_pattern(pattern: str, what: str) -> re.Pattern[str] | None:
    """The compiled expression, None for "" (matches nothing); InvalidValue if broken."""
    if not isinstance(pattern, str):
        raise InvalidValue(f"{what} must be a string, got {type(pattern).__name__}")
    if pattern == "":
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidValue(f"invalid regular expression '{pattern}' for {what}: {exc}") from None


def _matches(regex: re.Pattern[str] | None, name: str) -> bool:
    return regex is not None and regex.search(name) is not None


@dataclass
class User:
    name: str
    password_hash: str = ""
    hashing_algorithm: str = passwords.DEFAULT_ALGORITHM
    tags: tuple[str, ...] = ()
    # RabbitMQ's per-user limits: "max-connections", "max-channels" (absent: none;
    # negative: none either, kept as set because RabbitMQ lists it so).
    limits: dict[str, int] = field(default_factory=dict)

    @property
    def is_impersonator(self) -> bool:
        return "impersonator" in self.tags

    def limit(self, name: str) -> int | None:
        """The limit in force, None when there is none."""
        value = self.limits.get(name)
        return value if value is not None and value >= 0 else None

    def record(self) -> dict[str, Any]:
        """The user as RabbitMQ's definitions and /api/users have it."""
        return {
            "name": self.name,
            "password_hash": self.password_hash,
            "hashing_algorithm": self.hashing_algorithm,
            "tags": list(self.tags),
            "limits": dict(self.limits),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> User:
        return cls(
            record["name"],
            record.get("password_hash", ""),
            record.get("hashing_algorithm", passwords.DEFAULT_ALGORITHM),
            tuple(record.get("tags", ())),
            dict(record.get("limits") or {}),
        )


def _erlang_term(value: Any) -> str:
    """A value as RabbitMQ's errors print it (strings as Erlang binaries)."""
    if isinstance(value, str):
        return '<<"' + value + '">>'
    return json.dumps(value)


def check_user_limits(limits: Any) -> None:
    """InvalidValue, in RabbitMQ's words, unless `limits` maps known names to integers."""
    if not isinstance(limits, dict):
        raise InvalidValue(
            'user limits must be a JSON object, e.g. {"max-connections": 10, "max-channels": 20}'
        )
    unknown = [(k, v) for k, v in limits.items() if k not in USER_LIMITS]
    if unknown:
        terms = ",".join("{" + _erlang_term(k) + "," + _erlang_term(v) + "}" for k, v in unknown)
        raise InvalidValue(f"Unrecognised terms [{terms}] in user-limits")
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValue(f"{key} should be a number, actually was {_erlang_term(value)}")


def parse_tags(tags: Any) -> tuple[str, ...]:
    """Tags as RabbitMQ takes them: a list, or one comma-separated string."""
    if isinstance(tags, str):
        items = [t.strip() for t in tags.split(",")]
    elif isinstance(tags, list | tuple):
        items = [str(t).strip() for t in tags]
    else:
        raise InvalidValue(f"tags must be a list or a comma-separated string, got {tags!r}")
    return tuple(t for t in items if t)


@dataclass
class Permission:
    """configure / write / read expressions of one user in one vhost."""

    user: str
    vhost: str
    configure: str = ANYTHING
    write: str = ANYTHING
    read: str = ANYTHING
    _compiled: dict[str, re.Pattern[str] | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for kind in ("configure", "write", "read"):
            self._compiled[kind] = compile_pattern(getattr(self, kind), f"{kind} permission")

    @property
    def unrestricted(self) -> bool:
        return self.configure == self.write == self.read == ANYTHING

    def allows(self, kind: str, name: str) -> bool:
        return _matches(self._compiled[kind], name)

    def record(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "vhost": self.vhost,
            "configure": self.configure,
            "write": self.write,
            "read": self.read,
        }


@dataclass
class TopicPermission:
    """write / read expressions on routing keys, for one topic exchange."""

    user: str
    vhost: str
    exchange: str
    write: str = ANYTHING
    read: str = ANYTHING

    def __post_init__(self) -> None:
        # Validate now; the guard compiles again with {username} and {vhost} filled in.
        for kind in ("write", "read"):
            compile_pattern(getattr(self, kind), f"topic {kind} permission")

    def compiled(self, kind: str) -> re.Pattern[str] | None:
        """The expression with RabbitMQ's variables expanded, compiled."""
        pattern = getattr(self, kind).replace("{username}", re.escape(self.user))
        pattern = pattern.replace("{vhost}", re.escape(self.vhost))
        return compile_pattern(pattern, f"topic {kind} permission")

    def record(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "vhost": self.vhost,
            "exchange": self.exchange,
            "write": self.write,
            "read": self.read,
        }


class AccessControl:
    """Users and permissions in memory; the broker's admin operations keep it and the disk in step."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}
        self.topic_permissions: dict[tuple[str, str], dict[str, TopicPermission]] = {}

    def authenticate(self, username: str, password: str) -> User | None:
        """The user if the password matches; as slow for unknown users as for known ones.

        An empty password never logs in, as with RabbitMQ's internal backend: a user
        made without a password (its hash is that of "") or whose password was cleared
        logs in with a certificate (SASL EXTERNAL) only."""
        user = self.users.get(username)
        if user is None or password == "":
            passwords.check_password("", passwords.SHA256, password)
            return None
        if passwords.check_password(user.password_hash, user.hashing_algorithm, password):
            return user
        return None

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self.permissions.get((user, vhost))

    def topics(self, user: str, vhost: str) -> dict[str, TopicPermission]:
        return self.topic_permissions.get((user, vhost), {})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback addresses."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
