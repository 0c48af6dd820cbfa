"""Runs the plugin cases against one broker and turns its answers into records.

The same code drives RabbitMQ (record.py) and Leveret (the replay test): HTTP with
urllib, AMQP with leveret.client. A record per recorded step:
`{"step": i, "status", "shape", "body"}` for HTTP, `{"step": i, "message": ...}`
for a message fetched with `get`.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from leveret.client.blocking import connect
from leveret.protocol import fieldtable as ft
from leveret.protocol import properties as pp

from ..common import masked, shape

# What changes from run to run (never compared): times, ids, statistics.
VOLATILE = (
    "timestamp",
    "id",
    "local_connection",
    "local_channel",
    "*.x-shovelled-timestamp.v",
    "properties_key",  # an opaque id: RabbitMQ's hashes the arguments its own way
)
# Queue fields that say what a link made (the rest are statistics).
QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type")
PROPERTY_NAMES = {
    pp.FLAG_CONTENT_TYPE: "content_type",
    pp.FLAG_CONTENT_ENCODING: "content_encoding",
    pp.FLAG_DELIVERY_MODE: "delivery_mode",
    pp.FLAG_PRIORITY: "priority",
    pp.FLAG_CORRELATION_ID: "correlation_id",
    pp.FLAG_REPLY_TO: "reply_to",
    pp.FLAG_EXPIRATION: "expiration",
    pp.FLAG_MESSAGE_ID: "message_id",
    pp.FLAG_TIMESTAMP: "timestamp",
    pp.FLAG_TYPE: "type",
    pp.FLAG_USER_ID: "user_id",
    pp.FLAG_APP_ID: "app_id",
    pp.FLAG_CLUSTER_ID: "cluster_id",
}


class Driver:
    def __init__(self, api: str, amqp: str, user: str = "guest:guest") -> None:
        self.api = api.rstrip("/")
        self.amqp = amqp
        self.auth = "Basic " + base64.b64encode(user.encode()).decode()
        self.cluster = ""
        overview = self.http("GET", "/api/overview")[1]
        self.cluster, self.node = overview["cluster_name"], overview["node"]

    # --- HTTP ---------------------------------------------------------------------

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        path = path.replace("{cluster}", urllib.parse.quote(self.cluster, safe=""))
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.api + path, data, method=method)
        request.add_header("Authorization", self.auth)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    # --- a case -------------------------------------------------------------------

    def run(self, steps: list[list[Any]]) -> list[dict[str, Any]]:
        records = []
        variables = {"cluster": self.cluster, "node": self.node}
        for i, step in enumerate(steps):
            kind = step[0]
            if kind == "http":
                _, method, path, body = step[:4]
                status, answer = self.http(method, path, body)
                if step[4:5] == ["quiet"]:
                    continue
                if "/api/queues/" in path and isinstance(answer, dict):
                    answer = {k: answer[k] for k in QUEUE_FIELDS if k in answer}
                records.append(
                    {
                        "step": i,
                        "status": status,
                        "shape": shape(answer),
                        "body": masked(answer, VOLATILE, variables),
                    }
                )
            elif kind == "publish":
                _, exchange, key, body, props = step
                with connect(self.amqp) as conn:
                    conn.channel().publish(
                        body.encode(), routing_key=key, exchange=exchange, **props
                    )
            elif kind == "get":
                message = self.get(step[1])
                records.append({"step": i, "message": masked(message, VOLATILE, variables)})
            elif kind == "wait_shovel":
                self.wait(lambda s=step: self._shovel_state(s[1], s[2]) == s[3], step)
            elif kind == "wait_link":
                self.wait(lambda s=step: self._links_are(s[1]), step)
            elif kind == "sleep":
                time.sleep(step[1])
            else:
                raise ValueError(f"unknown step {step!r}")
        return records

    def wait(self, predicate: Any, step: list[Any], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"step {step} did not happen within {timeout} s")
            time.sleep(0.1)

    def _shovel_state(self, vhost: str, name: str) -> str | None:
        _, rows = self.http("GET", "/api/shovels")
        for row in rows or []:
            if row.get("vhost") == vhost and row.get("name") == name:
                return row.get("state")
        return None

    def _links_are(self, status: str) -> bool:
        _, rows = self.http("GET", "/api/federation-links")
        return bool(rows) and all(r.get("status") == status for r in rows)

    def get(self, queue: str, timeout: float = 10.0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with connect(self.amqp) as conn:
            ch = conn.channel()
            while time.monotonic() < deadline:
                message = ch.get(queue, no_ack=True)
                if message is not None:
                    return describe(message)
                time.sleep(0.1)
        return None


def describe(message: Any) -> dict[str, Any]:
    """A message as recorded: body, routing, and every property with its wire type."""
    header = message.raw_header or b""
    out: dict[str, Any] = {
        "body": message.body.decode(errors="replace"),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "redelivered": message.redelivered,
    }
    props: dict[str, Any] = {}
    if header:
        for flag, raw in pp.split_properties(header).items():
            if flag == pp.FLAG_HEADERS:
                props["headers"] = typed_table(raw)
            elif flag in (pp.FLAG_DELIVERY_MODE, pp.FLAG_PRIORITY):
                props[PROPERTY_NAMES[flag]] = raw[0]
            elif flag == pp.FLAG_TIMESTAMP:
                props["timestamp"] = int.from_bytes(raw, "big")
            else:
                props[PROPERTY_NAMES[flag]] = raw[1:].decode(errors="replace")
    out["properties"] = props
    return out


def typed_table(raw: bytes) -> dict[str, Any]:
    return {key: typed(value) for key, value in ft.split_table(raw).items()}


def typed(value: bytes) -> dict[str, Any]:
    """{"t": AMQP type letter, "v": value}, recursively for tables and arrays."""
    kind = chr(value[0])
    if kind == "F":
        return {"t": "F", "v": typed_table(value[1:])}
    if kind == "A":
        return {"t": "A", "v": [typed(e) for e in ft.split_array(value)]}
    decoded = ft.decode_value(value)
    if isinstance(decoded, bytes):
        decoded = decoded.decode(errors="replace")
    elif not isinstance(decoded, int | float | str | bool | type(None)):
        decoded = str(decoded)
    return {"t": kind, "v": decoded}
