"""MQTT control packets (3.1, 3.1.1 and 5.0) as plain objects, and their constants.

The codec (mqtt/codec.py) turns bytes into these and back; nothing here reads a
socket. One class per packet type; MQTT 5's properties travel as a dict keyed by
the property's name in `PROPERTY_NAMES` (`user_property` is a list of pairs,
`subscription_identifier` a list of ints in a PUBLISH).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Protocol levels in CONNECT.
MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5
PROTOCOL_NAMES = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}

# Packet types (the fixed header's high nibble).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

# The fixed-header flags each type must carry (PUBLISH's are its dup/qos/retain).
REQUIRED_FLAGS = {PUBREL: 0b0010, SUBSCRIBE: 0b0010, UNSUBSCRIBE: 0b0010}

# MQTT 3.1.1 CONNACK return codes.
CONNACK_ACCEPTED = 0
CONNACK_BAD_PROTOCOL = 1
CONNACK_ID_REJECTED = 2
CONNACK_SERVER_UNAVAILABLE = 3
CONNACK_BAD_CREDENTIALS = 4
CONNACK_NOT_AUTHORIZED = 5

# MQTT 5 reason codes the broker uses.
RC_SUCCESS = 0x00
RC_GRANTED_QOS_1 = 0x01
RC_DISCONNECT_WITH_WILL = 0x04
RC_NO_MATCHING_SUBSCRIBERS = 0x10
RC_NO_SUBSCRIPTION_EXISTED = 0x11
RC_UNSPECIFIED_ERROR = 0x80
RC_MALFORMED_PACKET = 0x81
RC_PROTOCOL_ERROR = 0x82
RC_IMPLEMENTATION_SPECIFIC = 0x83
RC_UNSUPPORTED_PROTOCOL_VERSION = 0x84
RC_CLIENT_ID_NOT_VALID = 0x85
RC_BAD_USERNAME_OR_PASSWORD = 0x86
RC_NOT_AUTHORIZED = 0x87
RC_SERVER_UNAVAILABLE = 0x88
RC_SERVER_SHUTTING_DOWN = 0x8B
RC_BAD_AUTHENTICATION_METHOD = 0x8C
RC_KEEP_ALIVE_TIMEOUT = 0x8D
RC_SESSION_TAKEN_OVER = 0x8E
RC_TOPIC_FILTER_INVALID = 0x8F
RC_TOPIC_NAME_INVALID = 0x90
RC_PACKET_ID_NOT_FOUND = 0x92
RC_RECEIVE_MAXIMUM_EXCEEDED = 0x93
RC_TOPIC_ALIAS_INVALID = 0x94
RC_PACKET_TOO_LARGE = 0x95
RC_QUOTA_EXCEEDED = 0x97
RC_ADMINISTRATIVE_ACTION = 0x98
RC_PAYLOAD_FORMAT_INVALID = 0x99
RC_QOS_NOT_SUPPORTED = 0x9B
RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
RC_SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1
RC_WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# MQTT 5 properties: id → (name, wire type). Types: "byte", "u16", "u32", "varint",
# "utf8", "binary", "pair".
PROPERTIES: dict[int, tuple[str, str]] = {
    0x01: ("payload_format_indicator", "byte"),
    0x02: ("message_expiry_interval", "u32"),
    0x03: ("content_type", "utf8"),
    0x08: ("response_topic", "utf8"),
    0x09: ("correlation_data", "binary"),
    0x0B: ("subscription_identifier", "varint"),
    0x11: ("session_expiry_interval", "u32"),
    0x12: ("assigned_client_identifier", "utf8"),
    0x13: ("server_keep_alive", "u16"),
    0x15: ("authentication_method", "utf8"),
    0x16: ("authentication_data", "binary"),
    0x17: ("request_problem_information", "byte"),
    0x18: ("will_delay_interval", "u32"),
    0x19: ("request_response_information", "byte"),
    0x1A: ("response_information", "utf8"),
    0x1C: ("server_reference", "utf8"),
    0x1F: ("reason_string", "utf8"),
    0x21: ("receive_maximum", "u16"),
    0x22: ("topic_alias_maximum", "u16"),
    0x23: ("topic_alias", "u16"),
    0x24: ("maximum_qos", "byte"),
    0x25: ("retain_available", "byte"),
    0x26: ("user_property", "pair"),
    0x27: ("maximum_packet_size", "u32"),
    0x28: ("wildcard_subscription_available", "byte"),
    0x29: ("subscription_identifier_available", "byte"),
    0x2A: ("shared_subscription_available", "byte"),
}
PROPERTY_IDS: dict[str, int] = {name: pid for pid, (name, _) in PROPERTIES.items()}
PROPERTY_NAMES = frozenset(PROPERTY_IDS)
# Properties that may appear more than once (kept as lists).
REPEATABLE = frozenset({"user_property", "subscription_identifier"})

# Which properties each packet may carry (MQTT 5 section 2.2.2.2); "will" is the
# CONNECT payload's will properties.
ALLOWED_PROPERTIES: dict[str, frozenset[str]] = {
    "connect": frozenset(
        {
            "session_expiry_interval",
            "authentication_method",
            "authentication_data",
            "request_problem_information",
            "request_response_information",
            "receive_maximum",
            "topic_alias_maximum",
            "user_property",
            "maximum_packet_size",
        }
    ),
    "will": frozenset(
        {
            "payload_format_indicator",
            "message_expiry_interval",
            "content_type",
            "response_topic",
            "correlation_data",
            "will_delay_interval",
            "user_property",
        }
    ),
    "connack": frozenset(
        {
            "session_expiry_interval",
            "assigned_client_identifier",
            "server_keep_alive",
            "authentication_method",
            "authentication_data",
            "response_information",
            "server_reference",
            "reason_string",
            "receive_maximum",
            "topic_alias_maximum",
            "maximum_qos",
            "retain_available",
            "user_property",
            "maximum_packet_size",
            "wildcard_subscription_available",
            "subscription_identifier_available",
            "shared_subscription_available",
        }
    ),
    "publish": frozenset(
        {
            "payload_format_indicator",
            "message_expiry_interval",
            "content_type",
            "response_topic",
            "correlation_data",
            "subscription_identifier",
            "topic_alias",
            "user_property",
        }
    ),
    "ack": frozenset({"reason_string", "user_property"}),
    "subscribe": frozenset({"subscription_identifier", "user_property"}),
    "unsubscribe": frozenset({"user_property"}),
    "disconnect": frozenset(
        {"session_expiry_interval", "server_reference", "reason_string", "user_property"}
    ),
    "auth": frozenset(
        {"authentication_method", "authentication_data", "reason_string", "user_property"}
    ),
}


@dataclass
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass
class Connect:
    client_id: str
    protocol_level: int = MQTT_3_1_1
    clean_start: bool = True  # 3.1.1's clean session
    keepalive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    type = CONNECT


@dataclass
class Connack:
    session_present: bool = False
    reason_code: int = 0  # 3.1.1's return code, or MQTT 5's reason code
    properties: dict[str, Any] = field(default_factory=dict)
    type = CONNACK


@dataclass
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    type = PUBLISH


@dataclass
class PubAck:
    """PUBACK, PUBREC, PUBREL and PUBCOMP: a packet id and (MQTT 5) a reason code."""

    packet_type: int
    packet_id: int
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> int:
        return self.packet_type


@dataclass
class Subscription:
    topic_filter: str
    qos: int = 0
    no_local: bool = False  # MQTT 5 subscription options
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: dict[str, Any] = field(default_factory=dict)
    type = SUBSCRIBE


@dataclass
class Suback:
    packet_id: int
    reason_codes: list[int]  # granted QoS, or 0x80 (3.1.1) / a reason code (5.0)
    properties: dict[str, Any] = field(default_factory=dict)
    type = SUBACK


@dataclass
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: dict[str, Any] = field(default_factory=dict)
    type = UNSUBSCRIBE


@dataclass
class Unsuback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # MQTT 5 only
    properties: dict[str, Any] = field(default_factory=dict)
    type = UNSUBACK


@dataclass
class PingReq:
    type = PINGREQ


@dataclass
class PingResp:
    type = PINGRESP


@dataclass
class Disconnect:
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)
    type = DISCONNECT


@dataclass
class Auth:
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)
    type = AUTH


Packet = (
    Connect
    | Connack
    | Publish
    | PubAck
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
