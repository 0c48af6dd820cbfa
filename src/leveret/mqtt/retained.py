"""Retained MQTT messages: the last retained PUBLISH of each topic, per vhost.

Kept in memory and, when the broker persists, in an SQLite file in the data dir
(`mqtt-retained.sqlite`), written at once: a retained message survives a restart
as RabbitMQ's DETS store keeps it. Retained publishes are rare next to ordinary
ones, so a synchronous write per retained message is cheap enough and keeps this
module free of the store's group commit.

A subscription gets the retained messages of every topic its filter matches,
wildcard filters included (MQTT 3.3.1.3); RabbitMQ 3.10 looks up the filter as an
exact topic only (docs/differences.md#mqtt-retained-wildcards).
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from leveret.mqtt.topics import matches

FILE_NAME = "mqtt-retained.sqlite"


@dataclass
class Retained:
    payload: bytes
    qos: int
    properties: dict[str, Any] = field(default_factory=dict)  # MQTT 5 message properties


def _encode_properties(props: dict[str, Any]) -> str:
    out: dict[str, Any] = {}
    for key, value in props.items():
        if isinstance(value, bytes):
            out[key] = {"b64": base64.b64encode(value).decode()}
        else:
            out[key] = value
    return json.dumps(out)


def _decode_properties(text: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for key, value in json.loads(text).items():
        if isinstance(value, dict) and "b64" in value:
            props[key] = base64.b64decode(value["b64"])
        elif key == "user_property":
            props[key] = [tuple(pair) for pair in value]
        else:
            props[key] = value
    return props


class RetainedStore:
    """Retained messages by (vhost, topic); `directory` None keeps them in memory."""

    remote = False  # (RetainedOnWorker0: the same calls, answered by worker 0)

    def __init__(self, directory: str | None = None) -> None:
        self._messages: dict[str, dict[str, Retained]] = {}
        self._db: sqlite3.Connection | None = None
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            self._db = sqlite3.connect(os.path.join(directory, FILE_NAME), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS retained (vhost TEXT, topic TEXT, qos INTEGER, "
                "payload BLOB, properties TEXT, PRIMARY KEY (vhost, topic))"
            )
            rows = self._db.execute("SELECT vhost, topic, qos, payload, properties FROM retained")
            for vhost, topic, qos, payload, props in rows:
                self._messages.setdefault(vhost, {})[topic] = Retained(
                    bytes(payload), qos, _decode_properties(props)
                )

    def retain(self, vhost: str, topic: str, message: Retained) -> None:
        """Keep `message` for `topic`; an empty payload clears the topic (MQTT 3.3.1.3)."""
        if not message.payload:
            self.clear(vhost, topic)
            return
        self._messages.setdefault(vhost, {})[topic] = message
        if self._db is not None:
            self._db.execute(
                "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?)",
                (
                    vhost,
                    topic,
                    message.qos,
                    message.payload,
                    _encode_properties(message.properties),
                ),
            )

    def clear(self, vhost: str, topic: str) -> None:
        if self._messages.get(vhost, {}).pop(topic, None) is not None and self._db is not None:
            self._db.execute("DELETE FROM retained WHERE vhost = ? AND topic = ?", (vhost, topic))

    def get(self, vhost: str, topic: str) -> Retained | None:
        return self._messages.get(vhost, {}).get(topic)

    def matching(self, vhost: str, topic_filter: str) -> list[tuple[str, Retained]]:
        """The retained messages whose topic `topic_filter` matches, by topic."""
        topics = self._messages.get(vhost)
        if not topics:
            return []
        if "+" not in topic_filter and "#" not in topic_filter:
            found = topics.get(topic_filter)
            return [(topic_filter, found)] if found is not None else []
        return sorted((t, m) for t, m in topics.items() if matches(topic_filter, t))

    def count(self, vhost: str | None = None) -> int:
        if vhost is not None:
            return len(self._messages.get(vhost, {}))
        return sum(len(t) for t in self._messages.values())

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class RetainedOnWorker0:
    """The retained messages of a broker of workers, from a worker other than 0.

    A broker holds its retained messages in one place, worker 0's `RetainedStore`
    (served by `serve_retained`), so a retained publish on any worker and a
    subscription on any other see the same ones. Each method is a call over the
    worker mesh; its future has the answer (PeerDown while worker 0 is down)."""

    remote = True

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    def retain(self, vhost: str, topic: str, message: Retained) -> Any:
        return self.mesh.call(
            0, "mqtt_retain", vhost, topic, message.payload, message.qos, message.properties
        )

    def matching(self, vhost: str, topic_filter: str) -> Any:
        return self.mesh.call(0, "mqtt_retained", vhost, topic_filter)

    def count(self, vhost: str | None = None) -> int:
        return 0  # (worker 0's store counts them)

    def close(self) -> None:
        pass


def serve_retained(mesh: Any, store: RetainedStore) -> None:
    """Worker 0 answers the other workers' retained publishes and lookups."""

    def retain(
        _peer: int, vhost: str, topic: str, payload: bytes, qos: int, props: dict[str, Any]
    ) -> None:
        store.retain(vhost, topic, Retained(payload, qos, props))

    def matching(_peer: int, vhost: str, topic_filter: str) -> list[tuple[str, Retained]]:
        return store.matching(vhost, topic_filter)

    mesh.serve("mqtt_retain", retain)
    mesh.serve("mqtt_retained", matching)
