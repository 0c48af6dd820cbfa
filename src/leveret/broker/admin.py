"""The operator's operations on the broker: vhosts, users, permissions and limits.

One place that `leveret ctl`, the embedded test broker and the management
API all call. Every change is stored first (the catalog is synchronous
SQLite) and then made visible, so a crash never leaves a vhost or user that
exists in memory but not on disk. Open connections see permission changes from
their next operation on; a deleted user's or vhost's connections are closed.
Errors are broker.errors, which each front end maps to its own codes.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from leveret.auth import passwords
from leveret.auth.users import (
    Permission,
    TopicPermission,
    User,
    check_user_limits,
    parse_tags,
)
from leveret.broker.errors import AlreadyExists, InvalidValue, NotFound
from leveret.broker.policies import Policy, PolicyError
from leveret.broker.queue_args import QUEUE_TYPES
from leveret.broker.vhost import VirtualHost

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

log = logging.getLogger("leveret.admin")

VHOST_LIMITS = ("max-connections", "max-queues")


def _key(*parts: str) -> str:
    return json.dumps(list(parts))


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidValue(f"{what} must be a non-empty string, got {value!r}")
    return value


class Admin:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.hooks = broker.hooks
        self.access = broker.access

    # --- start ----------------------------------------------------------------

    def load(self) -> None:
        """Build vhosts, users and permissions from the catalog; defaults on a first start."""
        records = self.hooks.catalog_load()
        if records is None:
            self._first_start()
            return
        for record in records.get("vhost", {}).values():
            self._make_vhost(record)
        for record in records.get("user", {}).values():
            self.access.users[record["name"]] = User.from_record(record)
        for record in records.get("permission", {}).values():
            perm = Permission(
                record["user"],
                record["vhost"],
                record["configure"],
                record["write"],
                record["read"],
            )
            self.access.permissions[(perm.user, perm.vhost)] = perm
        for kind in ("policy", "operator_policy"):
            for record in records.get(kind, {}).values():
                vhost = self.broker.vhosts.get(record["vhost"])
                if vhost is None:
                    continue
                try:
                    policy = _policy_from(record, operator=kind == "operator_policy")
                except PolicyError as exc:
                    # Kept on disk: a start must not fail on one record it cannot read.
                    log.error("stored %s not loaded: %s", kind.replace("_", " "), exc)
                    continue
                target = vhost.operator_policies if policy.operator else vhost.policies
                target[policy.name] = policy
        for record in records.get("topic_permission", {}).values():
            topic = TopicPermission(
                record["user"], record["vhost"], record["exchange"], record["write"], record["read"]
            )
            self.access.topic_permissions.setdefault((topic.user, topic.vhost), {})[
                topic.exchange
            ] = topic

    def _first_start(self) -> None:
        """RabbitMQ's defaults: one vhost and one administrator with full access to it."""
        config = self.broker.config
        self.add_vhost(config.default_vhost, "Default virtual host", exist_ok=True)
        if config.default_user not in self.access.users:
            self.add_user(config.default_user, config.default_pass, ["administrator"])
            self.set_permissions(config.default_user, config.default_vhost, ".*", ".*", ".*")
        self.hooks.catalog_initialize()

    # --- vhosts ---------------------------------------------------------------

    def _make_vhost(self, record: dict[str, Any]) -> VirtualHost:
        vhost = VirtualHost(record["name"], self.hooks, self.broker.counters)
        vhost.watchers = self.broker.vhost_watchers  # one list for all (federation)
        vhost.description = record.get("description", "")
        vhost.tags = list(record.get("tags", []))
        vhost.limits = dict(record.get("limits", {}))
        vhost.default_queue_type = record.get("default_queue_type")
        vhost.default_delivery_limit = self.broker.config.quorum_delivery_limit
        vhost.crossing = self.broker.crossing
        self.broker.vhosts[vhost.name] = vhost
        return vhost

    @staticmethod
    def _vhost_record(vhost: VirtualHost) -> dict[str, Any]:
        return {
            "name": vhost.name,
            "description": vhost.description,
            "tags": vhost.tags,
            "limits": vhost.limits,
            **({"default_queue_type": q} if (q := vhost.default_queue_type) else {}),
        }

    def vhost(self, name: str) -> VirtualHost:
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise NotFound(f"vhost '{name}' does not exist")
        return vhost

    def add_vhost(
        self,
        name: str,
        description: str = "",
        tags: list[str] | tuple[str, ...] = (),
        exist_ok: bool = False,
        user: str | None = None,
        default_queue_type: str | None = None,
    ) -> VirtualHost:
        """A new vhost; `user` (who asked) is named as the declarer of its exchanges.
        `default_queue_type`: the type of queues declared in it without x-queue-type
        (RabbitMQ 3.10's vhost metadata; set when the vhost is created, as there)."""
        _name(name, "vhost name")
        if default_queue_type is not None and default_queue_type not in QUEUE_TYPES:
            raise InvalidValue(
                f"invalid default queue type '{default_queue_type}'; known: "
                + ", ".join(QUEUE_TYPES)
            )
        existing = self.broker.vhosts.get(name)
        if existing is not None:
            if exist_ok:
                return existing
            raise AlreadyExists(f"vhost '{name}' already exists")
        record = {"name": name, "description": description, "tags": list(tags), "limits": {}}
        if default_queue_type is not None:
            record["default_queue_type"] = default_queue_type
        self.hooks.catalog_put("vhost", name, record)  # on disk before anyone can use it
        vhost = self._make_vhost(record)
        if user is not None:
            for exchange in vhost.exchanges.values():
                exchange.declared_by = user
        log.debug("vhost '%s' created", name)
        return vhost

    def delete_vhost(self, name: str) -> None:
        """Close its connections (320), delete its queues, exchanges and data."""
        vhost = self.vhost(name)
        del self.broker.vhosts[name]  # no new connection can open it from here on
        for conn in self.broker.connections_of(vhost=name):
            conn.force_close(text=f"CONNECTION_FORCED - vhost '{name}' is deleted")
        for queue in list(vhost.queues.values()):
            vhost.delete_queue(queue, reason="vhost deleted")
        for exchange in list(vhost.exchanges.values()):
            if exchange.name and exchange.durable:
                self.hooks.exchange_deleted(exchange)
            exchange.router.detach()
        self.hooks.vhost_deleted(name)
        self.broker.parameters.vhost_deleted(name)
        for key in [k for k in self.access.permissions if k[1] == name]:
            self._drop_permission(*key)
        for key in [k for k in self.access.topic_permissions if k[1] == name]:
            for exchange in list(self.access.topic_permissions[key]):
                self._drop_topic_permission(key[0], name, exchange)
        for policy in vhost.policies.values():
            self.hooks.catalog_delete("policy", _key(name, policy.name))
        for policy in vhost.operator_policies.values():
            self.hooks.catalog_delete("operator_policy", _key(name, policy.name))
        self.hooks.catalog_delete("vhost", name)
        self.broker.counters.vhost_deleted(vhost)  # node totals never go back
        log.info("vhost '%s' deleted", name)

    def list_vhosts(self) -> list[dict[str, Any]]:
        return [self._vhost_record(v) for v in sorted(self.broker.vhosts.values(), key=_by_name)]

    def set_vhost_limits(self, name: str, limits: dict[str, Any]) -> None:
        """RabbitMQ's vhost limits; a negative value means no limit, 0 allows none."""
        vhost = self.vhost(name)
        if not isinstance(limits, dict) or not limits:
            raise InvalidValue('limits must be a non-empty object, e.g. {"max-queues": 10}')
        for key, value in limits.items():
            if key not in VHOST_LIMITS:
                raise InvalidValue(
                    f"unknown vhost limit '{key}'; known limits: " + ", ".join(VHOST_LIMITS)
                )
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidValue(f"vhost limit '{key}' must be an integer, got {value!r}")
        new = {**vhost.limits, **limits}
        new = {k: v for k, v in new.items() if v >= 0}
        self.hooks.catalog_put("vhost", name, {**self._vhost_record(vhost), "limits": new})
        vhost.limits = new

    def clear_vhost_limits(self, name: str, key: str | None = None) -> None:
        vhost = self.vhost(name)
        new = {} if key is None else {k: v for k, v in vhost.limits.items() if k != key}
        self.hooks.catalog_put("vhost", name, {**self._vhost_record(vhost), "limits": new})
        vhost.limits = new

    # --- users ----------------------------------------------------------------

    def user(self, name: str) -> User:
        user = self.access.users.get(name)
        if user is None:
            raise NotFound(f"user '{name}' does not exist")
        return user

    def add_user(
        self,
        name: str,
        password: str | None = None,
        tags: Any = (),
        *,
        password_hash: str | None = None,
        hashing_algorithm: str = passwords.DEFAULT_ALGORITHM,
        replace: bool = False,
    ) -> User:
        """A user with a password (hashed here) or a RabbitMQ password hash (imports)."""
        _name(name, "user name")
        if name in self.access.users and not replace:
            raise AlreadyExists(f"user '{name}' already exists")
        if password is not None and password_hash is not None:
            raise InvalidValue("give a password or a password_hash, not both")
        if password is not None:
            if not isinstance(password, str):
                raise InvalidValue("password must be a string")
            password_hash = passwords.hash_password(password)
            hashing_algorithm = passwords.DEFAULT_ALGORITHM
        else:
            password_hash = password_hash or ""
            passwords.validate_hash(password_hash, hashing_algorithm)
        existing = self.access.users.get(name)
        limits = dict(existing.limits) if existing is not None else {}  # a new password keeps them
        user = User(name, password_hash, hashing_algorithm, parse_tags(tags), limits)
        self.hooks.catalog_put("user", name, user.record())
        self.access.users[name] = user
        self._access_changed(user=name)
        return user

    def delete_user(self, name: str) -> None:
        self.user(name)
        for key in [k for k in self.access.permissions if k[0] == name]:
            self._drop_permission(*key)
        for key in [k for k in self.access.topic_permissions if k[0] == name]:
            for exchange in list(self.access.topic_permissions[key]):
                self._drop_topic_permission(name, key[1], exchange)
        self.hooks.catalog_delete("user", name)
        del self.access.users[name]
        for conn in self.broker.connections_of(user=name):
            conn.force_close(text=f"CONNECTION_FORCED - user '{name}' is deleted")

    def change_password(self, name: str, password: str) -> None:
        user = self.user(name)
        self.add_user(name, password, user.tags, replace=True)

    def clear_password(self, name: str) -> None:
        """The user can no longer log in with a password (EXTERNAL still works)."""
        user = self.user(name)
        self.add_user(name, None, user.tags, password_hash="", replace=True)

    def set_user_tags(self, name: str, tags: Any) -> None:
        user = self.user(name)
        self.add_user(
            name,
            None,
            tags,
            password_hash=user.password_hash,
            hashing_algorithm=user.hashing_algorithm,
            replace=True,
        )

    def authenticate_user(self, name: str, password: str) -> bool:
        return self.access.authenticate(name, password) is not None

    def list_users(self) -> list[dict[str, Any]]:
        return [
            {"name": u.name, "tags": list(u.tags)}
            for u in sorted(self.access.users.values(), key=_by_name)
        ]

    # --- per-user limits --------------------------------------------------------

    def set_user_limits(self, name: str, limits: Any, replace: bool = False) -> None:
        """RabbitMQ's user limits (max-connections, max-channels): merged into the
        user's, or replacing them (definitions import). Checked when a connection or
        channel opens; what is already open stays open, as in RabbitMQ."""
        user = self.user(name)
        check_user_limits(limits)
        new = dict(limits) if replace else {**user.limits, **limits}
        self._store_user_limits(user, new)

    def clear_user_limits(self, name: str, key: str = "all") -> None:
        """One limit, or "all" of them (rabbitmqctl clear_user_limits)."""
        user = self.user(name)
        new = {} if key == "all" else {k: v for k, v in user.limits.items() if k != key}
        self._store_user_limits(user, new)

    def _store_user_limits(self, user: User, limits: dict[str, int]) -> None:
        self.hooks.catalog_put("user", user.name, {**user.record(), "limits": limits})
        user.limits = limits
        for conn in self.broker.connections_of(user=user.name):
            conn.access_changed()

    def list_user_limits(self, name: str | None = None) -> list[dict[str, Any]]:
        """[{"user": ..., "value": {...}}] for users that have limits (GET /api/user-limits)."""
        users = [self.user(name)] if name is not None else self.access.users.values()
        return [
            {"user": u.name, "value": dict(u.limits)}
            for u in sorted(users, key=_by_name)
            if u.limits
        ]

    # --- permissions ----------------------------------------------------------

    def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> Permission:
        self.user(user)
        self.vhost(vhost)
        perm = Permission(user, vhost, configure, write, read)  # refuses bad expressions
        self.hooks.catalog_put("permission", _key(vhost, user), perm.record())
        self.access.permissions[(user, vhost)] = perm
        self._access_changed(user=user, vhost=vhost)
        return perm

    def clear_permissions(self, user: str, vhost: str) -> None:
        self.user(user)
        self.vhost(vhost)
        if (user, vhost) not in self.access.permissions:
            raise NotFound(f"user '{user}' has no permissions in vhost '{vhost}'")
        self._drop_permission(user, vhost)
        self._access_changed(user=user, vhost=vhost)

    def _drop_permission(self, user: str, vhost: str) -> None:
        self.hooks.catalog_delete("permission", _key(vhost, user))
        self.access.permissions.pop((user, vhost), None)

    def list_permissions(
        self, vhost: str | None = None, user: str | None = None
    ) -> list[dict[str, Any]]:
        if vhost is not None:
            self.vhost(vhost)
        if user is not None:
            self.user(user)
        return [
            p.record()
            for (u, v), p in sorted(self.access.permissions.items(), key=lambda kv: kv[0][::-1])
            if (vhost is None or v == vhost) and (user is None or u == user)
        ]

    def set_topic_permissions(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> TopicPermission:
        self.user(user)
        self.vhost(vhost)
        _name(exchange, "exchange name")
        topic = TopicPermission(user, vhost, exchange, write, read)
        self.hooks.catalog_put("topic_permission", _key(vhost, user, exchange), topic.record())
        self.access.topic_permissions.setdefault((user, vhost), {})[exchange] = topic
        self._access_changed(user=user, vhost=vhost)
        return topic

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        self.user(user)
        self.vhost(vhost)
        existing = self.access.topic_permissions.get((user, vhost), {})
        names = list(existing) if exchange is None else [exchange]
        if not names or any(n not in existing for n in names):
            raise NotFound(
                f"user '{user}' has no topic permissions in vhost '{vhost}'"
                + (f" for exchange '{exchange}'" if exchange else "")
            )
        for name in names:
            self._drop_topic_permission(user, vhost, name)
        self._access_changed(user=user, vhost=vhost)

    def _drop_topic_permission(self, user: str, vhost: str, exchange: str) -> None:
        self.hooks.catalog_delete("topic_permission", _key(vhost, user, exchange))
        per_vhost = self.access.topic_permissions.get((user, vhost), {})
        per_vhost.pop(exchange, None)
        if not per_vhost:
            self.access.topic_permissions.pop((user, vhost), None)

    def list_topic_permissions(
        self, vhost: str | None = None, user: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            t.record()
            for (u, v), per_exchange in sorted(
                self.access.topic_permissions.items(), key=lambda kv: kv[0][::-1]
            )
            for t in per_exchange.values()
            if (vhost is None or v == vhost) and (user is None or u == user)
        ]

    # --- policies ---------------------------------------------------------------

    def set_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
        operator: bool = False,
    ) -> Policy:
        """Add or replace a policy; matching queues and exchanges change at once."""
        return self.vhost(vhost).set_policy(name, pattern, definition, priority, apply_to, operator)

    def clear_policy(self, vhost: str, name: str, operator: bool = False) -> None:
        self.vhost(vhost).clear_policy(name, operator)

    def list_policies(self, vhost: str = "/", operator: bool = False) -> list[dict[str, Any]]:
        target = self.vhost(vhost)
        policies = target.operator_policies if operator else target.policies
        return [{"vhost": vhost, **p.record()} for p in sorted(policies.values(), key=_by_name)]

    def set_operator_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "queues",
    ) -> Policy:
        return self.set_policy(vhost, name, pattern, definition, priority, apply_to, operator=True)

    def clear_operator_policy(self, vhost: str, name: str) -> None:
        self.clear_policy(vhost, name, operator=True)

    def list_operator_policies(self, vhost: str = "/") -> list[dict[str, Any]]:
        return self.list_policies(vhost, operator=True)

    def _access_changed(self, user: str, vhost: str | None = None) -> None:
        """Open connections of `user` re-read their permissions before their next operation."""
        for conn in self.broker.connections_of(user=user, vhost=vhost):
            conn.access_changed()


def _policy_from(record: dict[str, Any], operator: bool) -> Policy:
    return Policy(
        record["name"],
        record["pattern"],
        record["definition"],
        record.get("priority", 0),
        record.get("apply-to", "all"),
        operator,
    )


def _by_name(item: Any) -> str:
    return item.name
