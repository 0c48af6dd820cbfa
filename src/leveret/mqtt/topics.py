"""MQTT topic names and filters: validation, matching, and RabbitMQ's mapping to AMQP.

RabbitMQ's MQTT plugin routes through a topic exchange, so an MQTT topic becomes
an AMQP routing key: the level separator `/` becomes `.`, the single-level wildcard
`+` becomes `*`, and `#` stays `#`. The mapping is textual, both ways, as
RabbitMQ's: an MQTT topic with a `.` in a level gets an extra level in AMQP.
"""

from __future__ import annotations

_TO_AMQP = str.maketrans({"/": ".", "+": "*"})
_TO_MQTT = str.maketrans({".": "/", "*": "+"})

SHARED_PREFIX = "$share/"


def to_amqp(topic: str) -> str:
    """An MQTT topic or filter as an AMQP routing key or binding key."""
    return topic.translate(_TO_AMQP)


def to_mqtt(routing_key: str) -> str:
    """An AMQP routing key (or binding key) as an MQTT topic (or filter)."""
    return routing_key.translate(_TO_MQTT)


def topic_name_error(topic: str) -> str | None:
    """Why `topic` cannot be a PUBLISH's topic name, or None."""
    if not topic:
        return "empty topic name"
    if "+" in topic or "#" in topic:
        return f"topic name {topic!r} contains a wildcard"
    return None


def topic_filter_error(topic_filter: str) -> str | None:
    """Why `topic_filter` is not a valid SUBSCRIBE filter, or None."""
    if not topic_filter:
        return "empty topic filter"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return f"'#' must be a whole last level in {topic_filter!r}"
        if "+" in level and level != "+":
            return f"'+' must be a whole level in {topic_filter!r}"
    return None


def matches(topic_filter: str, topic: str) -> bool:
    """Whether an MQTT topic matches a filter (MQTT 4.7), `$` topics excepted from
    leading wildcards."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(t_levels):
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
