"""Which vhost an MQTT connection logs in to, as RabbitMQ 3.10's MQTT plugin picks it.

Two global runtime parameters map connections to vhosts (RabbitMQ's names, set with
`PUT /api/global-parameters/NAME` or `leveret ctl set_global_parameter NAME JSON`):

- `mqtt_port_to_vhost_mapping`: `{"1883": "vhost1", "8883": "vhost2"}`, by the port
  the client connected to;
- `mqtt_default_vhosts`: `{"guest": "vhost1"}`, by the name a verified client
  certificate gives (the one `mqtt_ssl_cert_login` would log in as).

The order is the plugin's (rabbit_mqtt_processor:get_vhost/3). Without a verified
client certificate: a `vhost:user` user name, else the port mapping, else
`mqtt_vhost`. With one, the mappings come first: the certificate mapping, else the
port mapping, else a `vhost:user` user name, else `mqtt_vhost`. A user name is split
at its last colon.

RabbitMQ stores any JSON value under these names and fails the connections that
read a malformed one; Leveret refuses a malformed value when it is set
(broker/global_parameters.py), so a bad mapping is an error for the operator, not
for clients.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.global_parameters import CERT_TO_VHOST, PORT_TO_VHOST


def split_user(username: str) -> tuple[str | None, str]:
    """A `vhost:user` user name's vhost and user, split at the last colon; (None,
    username) without a colon. An empty vhost (":user") is a vhost that does not exist."""
    vhost, colon, user = username.rpartition(":")
    return (vhost, user) if colon else (None, username)


def pick_vhost(
    username: str,
    cert_name: str | None,
    port: int | None,
    parameters: dict[str, Any],
    default_vhost: str,
) -> tuple[str, str, str]:
    """(vhost, user, how it was picked) for a CONNECT's user name on `port`, with the
    verified client certificate's name `cert_name` (None without one). `parameters` are
    the broker's global parameters; how: "user name", "certificate mapping", "port
    mapping", "default"."""
    by_port = parameters.get(PORT_TO_VHOST)
    port_vhost = by_port.get(str(port)) if isinstance(by_port, dict) and port else None
    if cert_name is not None:
        by_cert = parameters.get(CERT_TO_VHOST)
        cert_vhost = by_cert.get(cert_name) if isinstance(by_cert, dict) else None
        if cert_vhost is not None:
            return cert_vhost, username, "certificate mapping"
        if port_vhost is not None:
            return port_vhost, username, "port mapping"
    vhost, user = split_user(username)
    if vhost is not None:
        return vhost, user, "user name"
    if port_vhost is not None:
        return port_vhost, username, "port mapping"
    return default_vhost, username, "default"
