"""Runtime parameters, RabbitMQ's model: (vhost, component, name) → a JSON value.

Shovels (`shovel`), federation upstreams (`federation-upstream`) and upstream
sets (`federation-upstream-set`) are defined this way, through
`PUT /api/parameters/{component}/{vhost}/{name}`, `leveret ctl set_parameter`
and the `parameters` list of a definitions file. The model only keeps them:
each component registers a validator (pure: it reads the value and, for some
checks, the broker), and whoever acts on them (leveret.links) subscribes to
changes. A parameter is stored in the catalog before it is visible or acted
on, so a restart brings back exactly what was confirmed.

`vhost-limits` is also a component, as in RabbitMQ, but its value lives on the
vhost itself (admin.set_vhost_limits); it is listed and set here for parity.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.errors import InvalidValue, NotFound

if TYPE_CHECKING:
    from leveret.auth.users import User
    from leveret.broker.broker import Broker

log = logging.getLogger("leveret.parameters")

# (broker, vhost, name, value, acting user or None) → problems, in RabbitMQ's words.
Validator = Callable[["Broker", str, str, Any, "User | None"], list[str]]
# (vhost, component, name, value or None when cleared)
Listener = Callable[[str, str, str, Any], None]

VHOST_LIMITS = "vhost-limits"


class ParameterError(InvalidValue):
    """A refused parameter; the text is RabbitMQ's "Validation failed" list."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("Validation failed\n\n" + "".join(p + "\n" for p in problems))
        self.problems = problems


class RuntimeParameters:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.values: dict[tuple[str, str, str], Any] = {}
        self.validators: dict[str, Validator] = {}
        self.listeners: list[Listener] = []

    def register(self, component: str, validator: Validator) -> None:
        self.validators[component] = validator

    def load(self, records: dict[str, Any]) -> None:
        """The stored parameters (a start). Not validated again: they were when set."""
        for record in records.get("parameter", {}).values():
            if record["vhost"] in self.broker.vhosts:
                key = (record["vhost"], record["component"], record["name"])
                self.values[key] = record["value"]

    # --- reading ---------------------------------------------------------------

    def get(self, vhost: str, component: str, name: str) -> Any:
        """The value; NotFound if there is none."""
        if component == VHOST_LIMITS:
            limits = self._vhost(vhost).limits
            if name != "limits" or not limits:
                raise NotFound(f"no {component} parameter '{name}' in vhost '{vhost}'")
            return dict(limits)
        try:
            return self.values[(vhost, component, name)]
        except KeyError:
            raise NotFound(f"no {component} parameter '{name}' in vhost '{vhost}'") from None

    def of(self, vhost: str, component: str) -> dict[str, Any]:
        """name → value of one component in one vhost."""
        return {n: v for (vh, c, n), v in self.values.items() if vh == vhost and c == component}

    def list(self, vhost: str | None = None, component: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's JSON objects ({value, vhost, component, name}), sorted."""
        out = [
            {"value": value, "vhost": vh, "component": c, "name": n}
            for (vh, c, n), value in self.values.items()
            if (vhost is None or vh == vhost) and (component is None or c == component)
        ]
        if component in (None, VHOST_LIMITS):
            for v in self.broker.vhosts.values():
                if v.limits and (vhost is None or v.name == vhost):
                    out.append(
                        {
                            "value": dict(v.limits),
                            "vhost": v.name,
                            "component": VHOST_LIMITS,
                            "name": "limits",
                        }
                    )
        return sorted(out, key=lambda p: (p["vhost"], p["component"], p["name"]))

    # --- changing ----------------------------------------------------------------

    def set(
        self, vhost: str, component: str, name: str, value: Any, user: User | None = None
    ) -> bool:
        """Validate, store, then tell the listeners; True if it is new."""
        self._vhost(vhost)
        if not isinstance(name, str) or not name:
            raise InvalidValue("a parameter's name must be a non-empty string")
        if component == VHOST_LIMITS:
            if name != "limits":
                raise ParameterError([f"name not recognised: {name}"])
            old = self._vhost(vhost).limits
            existed = bool(old)
            if not isinstance(value, dict):
                raise InvalidValue('limits must be a non-empty object, e.g. {"max-queues": 10}')
            # The value replaces the limits: those it leaves out go (-1: no limit).
            self.broker.admin.set_vhost_limits(vhost, {**{k: -1 for k in old}, **value})
            return not existed
        validator = self.validators.get(component)
        if validator is None:
            raise ParameterError([f"component {component} not found"])
        problems = validator(self.broker, vhost, name, value, user)
        if problems:
            raise ParameterError(problems)
        key = (vhost, component, name)
        existed = key in self.values
        record = {"vhost": vhost, "component": component, "name": name, "value": value}
        self.broker.hooks.catalog_put("parameter", json.dumps(list(key)), record)
        self.values[key] = value
        log.info("parameter %s '%s' in vhost '%s' set", component, name, vhost)
        self._tell(vhost, component, name, value)
        return not existed

    def clear(self, vhost: str, component: str, name: str) -> None:
        self._vhost(vhost)
        if component == VHOST_LIMITS:
            if name != "limits" or not self._vhost(vhost).limits:
                raise NotFound(f"no {component} parameter '{name}' in vhost '{vhost}'")
            self.broker.admin.clear_vhost_limits(vhost)
            return
        key = (vhost, component, name)
        if key not in self.values:
            raise NotFound(f"no {component} parameter '{name}' in vhost '{vhost}'")
        self.broker.hooks.catalog_delete("parameter", json.dumps(list(key)))
        del self.values[key]
        log.info("parameter %s '%s' in vhost '%s' cleared", component, name, vhost)
        self._tell(vhost, component, name, None)

    def vhost_deleted(self, vhost: str) -> None:
        """A deleted vhost takes its parameters along (its shovels stop)."""
        for key in [k for k in self.values if k[0] == vhost]:
            self.broker.hooks.catalog_delete("parameter", json.dumps(list(key)))
            del self.values[key]
            self._tell(key[0], key[1], key[2], None)

    def _tell(self, vhost: str, component: str, name: str, value: Any) -> None:
        for listener in list(self.listeners):
            try:
                listener(vhost, component, name, value)
            except Exception:  # a listener's bug must not undo a stored change
                log.exception("parameter listener failed for %s %s/%s", component, vhost, name)

    def _vhost(self, vhost: str) -> Any:
        v = self.broker.vhosts.get(vhost)
        if v is None:
            raise NotFound(f"vhost '{vhost}' does not exist")
        return v
