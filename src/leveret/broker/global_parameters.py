"""Global runtime parameters, RabbitMQ's: a name → any JSON value, in no vhost.

RabbitMQ keeps two of its own there, and so does Leveret:

- `internal_cluster_id`, made at the first start and never changed by the broker
  (Prometheus' `rabbitmq_cluster_permanent_id`);
- `cluster_name`, once someone sets one (`PUT /api/cluster-name`, this parameter,
  or a definitions import); without it the cluster name is the broker's default
  (`--cluster-name`, or the name made on the first start), as RabbitMQ falls back
  to its node name. Clearing it brings the default back.

`mqtt_port_to_vhost_mapping` and `mqtt_default_vhosts` pick MQTT connections'
vhosts (leveret.mqtt.vhosts). Any other name an administrator or policymaker sets
is kept and means nothing, as in RabbitMQ. Each parameter is a catalog record (kind `global_parameter`),
stored before it is visible, so a restart brings back what was answered, and a
cluster's followers hold it as they hold every catalog row.
"""

from __future__ import annotations

import json
import os
from typing import Any

from leveret.broker.errors import InvalidValue, NotFound

CLUSTER_NAME = "cluster_name"
INTERNAL_CLUSTER_ID = "internal_cluster_id"
KIND = "global_parameter"
# The MQTT plugin's vhost mappings (leveret.mqtt.vhosts), checked when they are set.
PORT_TO_VHOST = "mqtt_port_to_vhost_mapping"
CERT_TO_VHOST = "mqtt_default_vhosts"


def check_value(name: str, value: Any) -> None:
    """A cluster name is a string: RabbitMQ 3.10 stores any JSON value there and then
    resets every AMQP connection (its connection.start cannot carry a number or an
    object as the `cluster_name` property); Leveret refuses it. The MQTT vhost mappings
    are objects of names to vhost names: RabbitMQ stores anything and fails the MQTT
    connections that read a malformed one; Leveret refuses it."""
    if name == CLUSTER_NAME and not isinstance(value, str):
        raise InvalidValue(f"cluster_name must be a string, got {json.dumps(value)}")
    if name in (PORT_TO_VHOST, CERT_TO_VHOST):
        problem = mapping_problem(name, value)
        if problem is not None:
            raise InvalidValue(problem)


def mapping_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the MQTT vhost mapping `name`; None if it can: a JSON
    object of port numbers (or certificate user names) to vhost names."""
    what = "port number" if name == PORT_TO_VHOST else "certificate user name"
    shape = (
        '{"1883": "vhost1", "8883": "vhost2"}'
        if name == PORT_TO_VHOST
        else '{"CN=guest,O=client": "vhost1"}'
    )
    if not isinstance(value, dict):
        return (
            f"{name} must be a JSON object of {what} to vhost name, like {shape}; "
            f"got {json.dumps(value)}"
        )
    for key, vhost in value.items():
        if not isinstance(vhost, str) or not vhost:
            return (
                f"{name}: the vhost for {json.dumps(key)} must be a non-empty string, "
                f"got {json.dumps(vhost)}"
            )
        if name == PORT_TO_VHOST and not (key.isascii() and key.isdigit() and 0 < int(key) < 65536):
            return f"{name}: key {json.dumps(key)} is not a port number (1-65535)"
    return None


class GlobalParameters:
    def __init__(self, hooks: Any, records: dict[str, Any]) -> None:
        self.hooks = hooks
        self.values: dict[str, Any] = {
            record["name"]: record["value"] for record in records.get(KIND, {}).values()
        }

    def list(self) -> list[dict[str, Any]]:
        return [{"name": name, "value": self.values[name]} for name in sorted(self.values)]

    def get(self, name: str) -> Any:
        """The value; NotFound if there is none."""
        try:
            return self.values[name]
        except KeyError:
            raise NotFound(f"no global parameter '{name}'") from None

    def set(self, name: str, value: Any) -> bool:
        """Set (stored first); True if it existed before."""
        check_value(name, value)
        self.hooks.catalog_put(KIND, name, {"name": name, "value": value})
        existed = name in self.values
        self.values[name] = value
        return existed

    def clear(self, name: str) -> None:
        if name not in self.values:
            raise NotFound(f"no global parameter '{name}'")
        self.hooks.catalog_delete(KIND, name)
        del self.values[name]

    def cluster_id(self, seed: str | None = None) -> str:
        """internal_cluster_id, made (from `seed`, else at random) and stored if absent:
        at the first start, or once an administrator cleared it (RabbitMQ makes a new
        one when it is next asked for, too)."""
        value = self.values.get(INTERNAL_CLUSTER_ID)
        if value is None:
            value = seed or f"leveret-cluster-id-{os.urandom(11).hex()}"
            self.set(INTERNAL_CLUSTER_ID, value)
        return value if isinstance(value, str) else json.dumps(value)
