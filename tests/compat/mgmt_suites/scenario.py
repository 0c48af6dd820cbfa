"""Scenarios: RabbitMQ's own management test cases as sequences of requests.

A case of `tests/compat/http` is one request on a shared state. A test of RabbitMQ's
suites is a story: create a user, read it back, change it, log in as it, delete it.
A `Scenario` keeps that story: every step's answer is recorded (status, shape, masked
body, `Location`), so the replay compares each step, in order, on a broker that went
through the same earlier steps.

Steps are plain requests (`Step("PUT", "/api/users/suite-u", {...})`), AMQP actions
through pika (`amqp(...)`: open a connection, consume, publish, close), or waits for
RabbitMQ's statistics (`wait(path, want)`: they lag up to 5 s). Objects are named
`suite-*`; listings keep only those items (and RabbitMQ's own: `/`, `guest`,
`amq.*`), so a reference broker that other work shares records the same answers as
a fresh one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pika

from ..common import EMPTY, masked, named_keys, shape, sorted_lists
from ..http.runner import NOBODY, UNORDERED, VOLATILE, Raw, Target

__all__ = ["NOBODY", "Prev", "Raw", "Scenario", "Step", "amqp", "wait", "run_scenario"]

#: names every broker has, kept in listings beside the scenario's own `suite-*` objects
STABLE = {"/", "guest", ""}
#: fields that name an object in a listing's items
IDENTITY = ("name", "user", "vhost", "source", "destination", "queue", "exchange")


@dataclass
class Step:
    method: str
    path: str
    body: Any = NOBODY
    #: "user" (password "suite-pw", or "guest") or "user:password"
    user: str = "guest"
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    #: what of the answer is recorded: "full" (status, shape, body), "status" (the
    #: status alone: an answer whose content is RabbitMQ-internal)
    record: str = "full"
    #: extra volatile fields for this step
    volatile: tuple[str, ...] = ()
    #: a listing whose order is part of the answer (sorting cases); others are compared
    #: in a canonical order, as RabbitMQ's suites compare them
    ordered: bool = False


@dataclass
class Scenario:
    name: str
    steps: list[Step]
    #: run after the steps whatever happened, answers not recorded
    cleanup: list[Step] = field(default_factory=list)


@dataclass
class Prev:
    """A body taken from the previous step's answer: item `index` of it where it is a
    list, or all of it with `index=None` (RabbitMQ's suites publish back a message they
    just got, and import definitions they just exported)."""

    index: int | None = 0


def amqp(op: str, **kw: Any) -> Step:
    """An AMQP action through pika: `open` (label, user, vhost), `consume` (label,
    queue, tag, no_ack, arguments), `publish` (label, exchange, routing_key, body,
    properties), `channel` (label: one more channel), `close` (label). Its outcome
    (ok, or the AMQP error's code) is recorded."""
    return Step("AMQP", op, kw)


def wait(path: str, **want: Any) -> Step:
    """Poll GET `path` until every item of its list has `want`'s values (`count=N`: until
    the list, filtered to `suite-*` objects, has N such items; `has="messages"`: items
    with that field, which RabbitMQ adds once a queue's statistics arrive). Not
    recorded."""
    return Step("WAIT", "/api" + path, want)


def _stable(value: Any) -> bool:
    if isinstance(value, dict):
        value = value.get("name")
    # "{conn_a}": a connection or channel of the scenario's own, named by `masked`
    if not isinstance(value, str) or value in STABLE:
        return True
    if value.startswith("amq.gen-"):  # another client's server-named queue
        return False
    return value.startswith(("suite", "amq.", "{"))


def keep_own(body: Any) -> Any:
    """A listing with only the scenario's objects and every broker's own."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        kept = [i for i in body["items"] if _keep_item(i)]
        return {**body, "items": kept}
    if isinstance(body, list):
        return [i for i in body if _keep_item(i)]
    return body


def _keep_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return True
    return all(_stable(item[k]) for k in IDENTITY if k in item)


class Runner:
    """Runs scenarios against one broker (a `Target` of the http area)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conns: dict[str, pika.BlockingConnection] = {}
        self.channels: dict[str, Any] = {}
        self.last: Any = None

    def setup(self) -> None:
        overview = self.target.ok("GET", "/api/overview")
        self.target.variables = {
            "node": overview["node"],
            "amqp_port": urlsplit(self.target.amqp_url).port,
            "http_port": self.target.port,
        }

    def close_all(self) -> None:
        for conn in self.conns.values():
            try:
                conn.close()
            except Exception:  # closed by the scenario (a DELETE of the connection)
                pass
        self.conns.clear()
        self.channels.clear()

    def step(self, step: Step) -> dict[str, Any] | None:
        if step.method == "AMQP":
            return {"amqp": step.path, "outcome": self._amqp(step.path, **step.body)}
        if step.method == "WAIT":
            self._wait(step.path, dict(step.body))
            return None
        if step.method == "SLEEP":
            time.sleep(float(step.path))
            return None
        sent = step.body
        if isinstance(sent, Prev):
            sent = self._previous(sent.index)
        status, body, headers = self.target.call(
            step.method, step.path, sent, _user(step.user), step.query, step.headers
        )
        self.last = body
        record: dict[str, Any] = {"request": _request(step), "status": status}
        if step.record == "status":
            return record
        if body is NOBODY:
            record["shape"] = EMPTY
        else:
            body = named_keys(body, self.target.variables)
            volatile = VOLATILE + step.volatile
            body = keep_own(masked(body, volatile, self.target.variables))
            record["shape"] = shape(body)
            record["body"] = sorted_lists(
                body,
                UNORDERED + (() if step.ordered else ("",)),
            )
        if "location" in headers:
            record["location"] = masked(headers["location"], (), self.target.variables)
        if status == 405 or "allow" in headers and step.method == "OPTIONS":
            record["allow"] = headers.get("allow")
        return record

    def _previous(self, index: int | None) -> Any:
        if index is None:
            return self.last if self.last is not NOBODY else {}
        if isinstance(self.last, list) and len(self.last) > index:
            return self.last[index]
        return {}

    def _wait(self, path: str, want: dict[str, Any], timeout: float = 30.0) -> None:
        count = want.pop("count", None)
        has = want.pop("has", None)  # a field RabbitMQ adds once its statistics arrive
        want = {k: self.target.expand(v) if isinstance(v, str) else v for k, v in want.items()}
        deadline = time.monotonic() + timeout
        while True:
            status, found, _ = self.target.call("GET", path)
            if status == 200 and isinstance(found, list):
                found = keep_own(masked(found, (), self.target.variables))
                want = {k: masked(v, (), self.target.variables) for k, v in want.items()}
                matching = [
                    i
                    for i in found
                    if all(i.get(k) == v for k, v in want.items()) and (has is None or has in i)
                ]
                if (count is None and found and len(matching) == len(found)) or (
                    count is not None and len(matching) == count
                ):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not show {want} ({count}): {found}")
            time.sleep(0.25)

    def _amqp(self, op: str, label: str = "c", **kw: Any) -> Any:
        try:
            if op == "open":
                user = kw.get("user", "guest")
                password = kw.get("password", "guest" if user == "guest" else PASSWORD)
                base = self.target.amqp_url.split("@", 1)[1].rsplit("/", 1)[0]
                params = pika.URLParameters(f"amqp://{user}:{password}@{base}/%2F")
                params.virtual_host = kw.get("vhost", "/")
                params.heartbeat = 0
                if "name" in kw:
                    params.client_properties = {"connection_name": kw["name"]}
                conn = pika.BlockingConnection(params)
                self.conns[label] = conn
                self.channels[label] = conn.channel()
                sock = conn._impl._transport._sock  # the local port names the connection
                local = sock.getsockname()[1]
                port = self.target.variables["amqp_port"]
                self.target.variables[f"conn_{label}"] = f"127.0.0.1:{local} -> 127.0.0.1:{port}"
                return "ok"
            if op == "channel":
                self.channels[kw["as"]] = self.conns[label].channel()
                return "ok"
            ch = self.channels[label]
            if op == "consume":
                ch.basic_consume(
                    kw["queue"],
                    lambda *a: None,
                    auto_ack=kw.get("no_ack", False),
                    exclusive=kw.get("exclusive", False),
                    consumer_tag=kw.get("tag"),
                    arguments=kw.get("arguments"),
                )
                return "ok"
            if op == "publish":
                ch.basic_publish(
                    kw.get("exchange", ""),
                    kw["routing_key"],
                    kw.get("body", "").encode(),
                    pika.BasicProperties(**kw.get("properties", {})),
                )
                return "ok"
            if op == "declare":
                ch.queue_declare(
                    kw["queue"],
                    durable=kw.get("durable", False),
                    exclusive=kw.get("exclusive", False),
                    auto_delete=kw.get("auto_delete", False),
                    arguments=kw.get("arguments"),
                )
                return "ok"
            if op == "close_channel":
                ch.close()
                return "ok"
            if op == "close":
                self.conns.pop(label).close()
                return "ok"
            raise ValueError(f"unknown AMQP step {op}")
        except pika.exceptions.ChannelClosedByBroker as exc:
            return {"channel_closed": exc.reply_code}
        except pika.exceptions.ConnectionClosedByBroker as exc:
            return {"connection_closed": exc.reply_code}
        except pika.exceptions.ProbableAuthenticationError:
            return {"connection_closed": "auth"}
        except pika.exceptions.ProbableAccessDeniedError:
            return {"connection_closed": "access"}

    def run(self, scenario: Scenario) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        try:
            for i, step in enumerate(scenario.steps):
                try:
                    record = self.step(step)
                except Exception as exc:  # noqa: BLE001 - the record says what broke
                    record = {"error": f"step {i}: {type(exc).__name__}"}
                    records.append(record)
                    break
                if record is not None:
                    records.append(record)
        finally:
            self.close_all()
            for step in scenario.cleanup:
                try:
                    self.target.call(step.method, step.path, step.body, _user(step.user))
                except Exception:  # noqa: BLE001, S110 - best effort
                    pass
        return records


PASSWORD = "suite-pw"


def _user(user: str) -> str:
    if ":" in user or user == "guest":
        return user
    return f"{user}:{PASSWORD}"


def _request(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"method": step.method, "path": step.path}
    if step.user != "guest":
        out["user"] = step.user
    if step.query:
        out["query"] = step.query
    if isinstance(step.body, Raw):
        out["body"] = {"$raw": step.body.data.decode("latin-1")}
    elif isinstance(step.body, Prev):
        out["body"] = f"$previous[{step.body.index}]"
    elif step.body is not NOBODY:
        out["body"] = step.body
    return out


def run_scenarios(target: Target, scenarios: list[Scenario]) -> dict[str, list[dict[str, Any]]]:
    runner = Runner(target)
    runner.setup()
    return {s.name: runner.run(s) for s in scenarios}


run_scenario = Runner.run
