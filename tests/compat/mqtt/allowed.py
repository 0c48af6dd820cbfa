"""Where Leveret's MQTT answers differ from RabbitMQ 3.10's on purpose.

An entry names a scenario, the path of the observation that differs
(`observed.granted[]`, fnmatch patterns) and its entry in docs/differences.md;
the replay fails on any other difference, and on an entry that allows nothing.
"""

from __future__ import annotations

from ..common import Allowed

_VIOLATION = "differences.md#mqtt-protocol-violations"
_VIOLATION_WHY = "a protocol violation closes the connection (MQTT); RabbitMQ answers it"
_HANG = "differences.md#mqtt-malformed-hang"
_HANG_WHY = "a malformed packet closes the connection; RabbitMQ stops answering instead"

ALLOWED: list[Allowed] = [
    Allowed(
        "retained-wildcard",
        "value",
        "observed.messages",
        "differences.md#mqtt-retained-wildcards",
        "a wildcard subscription gets the retained messages it matches (MQTT 3.3.1.3)",
    ),
    Allowed(
        "dollar-topic-wildcard",
        "value",
        "observed.messages",
        "differences.md#mqtt-dollar-topics",
        "a filter starting with a wildcard does not match a topic starting with $ "
        "(MQTT 4.7.2); RabbitMQ matches it",
    ),
    Allowed(
        "map-amqp-properties-to-qos",
        "value",
        "observed.messages",
        "differences.md#mqtt-publish-qos-header",
        "an x-mqtt-publish-qos header pika sends as a long is used; RabbitMQ's QoS 1 "
        "subscriber stops receiving",
    ),
    Allowed(
        "qos2-publish",
        "value",
        "observed.after_pubrel.packets",
        "differences.md#mqtt-pubrel",
        "a PUBREL is answered with PUBCOMP (MQTT 4.3.3); RabbitMQ ignores it",
    ),
    Allowed(
        "connect-mqtt-5",
        "value",
        "observed.*",
        "differences.md#mqtt-5",
        "MQTT 5 is accepted (CONNACK 0); RabbitMQ 3.10 closes the connection",
    ),
    Allowed(
        "connect-unknown-level",
        "value",
        "observed.packets",
        "differences.md#mqtt-unknown-protocol-level",
        "CONNACK 1 before the close, as MQTT 3.1.2-2 asks; RabbitMQ just closes",
    ),
    Allowed("connect-will-qos3", "value", "observed.*", _VIOLATION, _VIOLATION_WHY),
    Allowed("malformed-second-connect", "value", "observed.*", _VIOLATION, _VIOLATION_WHY),
    Allowed("malformed-subscribe-no-filter", "value", "observed.*", _VIOLATION, _VIOLATION_WHY),
    Allowed("malformed-reserved-type-0", "value", "observed.*", _HANG, _HANG_WHY),
    Allowed("malformed-reserved-type-15", "value", "observed.*", _HANG, _HANG_WHY),
    Allowed("malformed-remaining-length", "value", "observed.*", _HANG, _HANG_WHY),
    Allowed(
        "malformed-publish-wildcard-topic",
        "value",
        "observed.*",
        "differences.md#mqtt-publish-topic-invalid",
        "a topic name with a wildcard closes the connection (MQTT 3.3.2.1); RabbitMQ routes it",
    ),
    Allowed(
        "publish-refused-write",
        "value",
        "observed.*",
        "differences.md#mqtt-publish-refused",
        "a refused publish closes the connection (MQTT 3.3.5-2); RabbitMQ neither "
        "acknowledges it nor closes",
    ),
    Allowed(
        "web-mqtt-bad-password",
        "value",
        "observed.answers.packets",
        "differences.md#mqtt-web-refusal",
        "the CONNACK (4) goes out before the close frame, as over TCP",
    ),
    Allowed(
        "vhost-port-mapping-malformed",
        "*",
        "observed.*",
        "differences.md#mqtt-vhost-mapping-malformed",
        "a malformed vhost mapping is refused when set (400); RabbitMQ stores it and then "
        "fails MQTT connections",
    ),
    Allowed(
        "overview-counts-mqtt",
        "value",
        "observed.during.channels",
        "differences.md#mqtt-channels",
        "an MQTT connection has no channels; RabbitMQ's plugin counts 2 internal ones",
    ),
]
