"""Bad input to worker 0's management API about objects of another worker: missing
queues and connections, wrong users, users without access, and a queue whose owner
is down, through worker 0 for objects of worker 1 (management/workers.py).

Every answer about an object of worker 1 is the answer a one-process broker gives
about the same object (its bodies are RabbitMQ's, recorded by tests/compat/http), so
each request goes to both and the answers are compared. Only a worker that is down
has no one-process counterpart: its durable queues answer as RabbitMQ answers for a
queue whose home node is down (404 `not_found` naming the node), its transient ones
as a missing queue."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from leveret.broker.queues.remote import RemoteQueue
from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from leveret.workers.mesh import placement
from workers.inprocess import InProcessWorkers, in_process_workers

VHOST = "wk-http-v"
GUEST = ("guest", "guest")
USERS = {
    # a management user with no permission in the vhost
    "wk-noperm": ("management", None),
    # a management user who may read only
    "wk-readonly": ("management", {"configure": "", "write": "", "read": ".*"}),
    # a management user with every permission (not the owner of guest's connections)
    "wk-mgmt": ("management", {"configure": ".*", "write": ".*", "read": ".*"}),
}
#: who may delete the queues
DELETERS = (GUEST, ("wk-mgmt", "pw"))
GET_BODY = {"ackmode": "ack_requeue_true", "count": 1, "encoding": "auto"}


def on_worker_1(prefix: str) -> str:
    for i in range(1000):
        name = f"{prefix}-{i}"
        if placement(VHOST, name, 2) == 1:
            return name
    raise AssertionError("no name found")


DURABLE = on_worker_1("wk-durable")
TRANSIENT = on_worker_1("wk-transient")
MISSING = on_worker_1("wk-missing")


class Api:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api"

    def __call__(
        self, method: str, path: str, auth: tuple[str, str] = GUEST, body: Any = None
    ) -> tuple[int, Any]:
        response = requests.request(method, f"{self.base}{path}", auth=auth, json=body, timeout=30)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text


def set_up(api: Api) -> None:
    """The same vhost, users and queues on either broker."""
    assert api("PUT", f"/vhosts/{VHOST}")[0] == 201
    for user, (tags, permissions) in USERS.items():
        assert api("PUT", f"/users/{user}", body={"password": "pw", "tags": tags})[0] == 201
        if permissions is not None:
            assert api("PUT", f"/permissions/{VHOST}/{user}", body=permissions)[0] == 201
    assert api("PUT", f"/queues/{VHOST}/{DURABLE}", body={"durable": True})[0] == 201
    assert api("PUT", f"/queues/{VHOST}/{TRANSIENT}", body={"durable": False})[0] == 201


def requests_about(queue: str) -> list[tuple[str, str, Any]]:
    path = f"/queues/{VHOST}/{queue}"
    return [
        ("GET", path, None),
        ("GET", f"{path}/bindings", None),
        ("DELETE", f"{path}/contents", None),
        ("POST", f"{path}/get", GET_BODY),
        ("DELETE", path, None),
    ]


def answers(api: Api, queue: str, users: list[tuple[str, str]]) -> dict[Any, Any]:
    out = {}
    for auth in users:
        for method, path, body in requests_about(queue):
            if auth in DELETERS and method == "DELETE" and path.endswith(queue):
                continue  # it would delete the queue the next user asks about
            status, doc = api(method, path, auth, body)
            if status == 200 and method == "GET" and path.endswith(queue):
                doc = {k: doc[k] for k in ("name", "vhost", "durable", "arguments")}
            out[(auth[0], method, path)] = (status, doc)
    return out


@pytest.fixture(scope="module")
def one_process() -> Iterator[Api]:
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config) as broker:
        api = Api(broker.server.management.port)
        set_up(api)
        yield api


@pytest.fixture
def workers() -> Iterator[tuple[InProcessWorkers, Api]]:
    with in_process_workers(2, per_worker={0: {"management_port": 0}}) as w:
        api = Api(w.nodes[0].management.port)
        set_up(api)
        for name in (DURABLE, TRANSIENT):
            placeholder = w.call(lambda name=name: w.nodes[0].broker.vhosts[VHOST].queues[name])
            assert type(placeholder) is RemoteQueue and placeholder.worker == 1
        yield w, api


ALL_USERS = [GUEST, ("guest", "wrong"), ("nobody", "pw"), *((u, "pw") for u in USERS)]


def test_queues_of_another_worker_answer_as_at_one_process(
    one_process: Api, workers: tuple[InProcessWorkers, Api]
) -> None:
    _, api = workers
    for queue in (MISSING, DURABLE, TRANSIENT):
        mine = answers(api, queue, ALL_USERS)
        assert mine == answers(one_process, queue, ALL_USERS), queue
    # the recorded bodies, for the record (tests/compat/http/recordings/queues.json)
    missing = f"/queues/{VHOST}/{MISSING}"
    assert api("GET", missing) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api("POST", f"{missing}/get", body=GET_BODY) == (
        404,
        {"error": "not_found", "reason": f"NOT_FOUND - no queue '{MISSING}' in vhost '{VHOST}'"},
    )
    noperm = ("wk-noperm", "pw")
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}/contents", noperm) == (
        401,
        {"error": "not_authorised", "reason": "User not authorised to access virtual host"},
    )
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}", ("wk-readonly", "pw")) == (
        401,
        {"error": "not_authorised", "reason": "Access refused."},
    )
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}", ("guest", "wrong")) == (
        401,
        {"error": "not_authorized", "reason": "Login failed"},
    )
    # and what the owner really did: the queue is still there, on every worker
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}")[0] == 204
    assert one_process("DELETE", f"/queues/{VHOST}/{DURABLE}")[0] == 204
    assert api("GET", f"/queues/{VHOST}/{DURABLE}")[0] == 404


def test_connections_of_another_worker_answer_as_at_one_process(
    one_process: Api, workers: tuple[InProcessWorkers, Api]
) -> None:
    w, api = workers
    mgmt, noperm = ("wk-mgmt", "pw"), ("wk-noperm", "pw")
    # a guest connection on worker 1
    client = pika.BlockingConnection(pika.URLParameters(w.url(1)))
    try:
        status, listed = api("GET", "/connections")
        assert status == 200
        [doc] = [c for c in listed if c.get("worker") == 1]
        name = doc["name"]
        for auth, method, want in (
            (mgmt, "GET", (401, "User not authorised to access object")),
            (noperm, "GET", (401, "User not authorised to access object")),
            (mgmt, "DELETE", (401, "User not authorised to access object")),
            (("guest", "wrong"), "DELETE", (401, "Login failed")),
        ):
            status, body = api(method, f"/connections/{name}", auth)
            assert (status, body["reason"]) == want, (auth, method)
        missing = (404, {"error": "Object Not Found", "reason": "Not Found"})
        assert api("DELETE", "/connections/nope") == missing
        assert one_process("DELETE", "/connections/nope") == missing
        assert api("GET", "/connections/nope") == missing
        assert client.is_open
        # closed by its client: its worker has it no more, whatever worker 0 last heard
        client.close()
        for _ in range(500):  # until worker 1 has let it go (its loop runs apart)
            if not w.call(lambda: len(w.nodes[1].broker.connections)):
                break
            time.sleep(0.01)
        assert api("DELETE", f"/connections/{name}") == missing
    finally:
        if client.is_open:
            client.close()


def test_closing_a_users_connections_closes_those_still_open(
    workers: tuple[InProcessWorkers, Api],
) -> None:
    """DELETE /api/connections/username/{user}: a connection of another worker that
    closed since that worker's last report is closed already; the others still are
    closed, and the answer is RabbitMQ's 204."""
    w, api = workers
    user = ("wk-mgmt", "pw")

    def connect(index: int) -> pika.BlockingConnection:
        params = pika.URLParameters(w.url(index))
        params.virtual_host = VHOST
        params.credentials = pika.PlainCredentials(*user)
        return pika.BlockingConnection(params)

    gone, *open_ = [connect(i) for i in (1, 1, 0)]
    try:
        status, listed = api("GET", f"/connections/username/{user[0]}")
        assert status == 200 and len(listed) == 3
        gone.close()
        for _ in range(500):  # until worker 1 has let it go
            if w.call(lambda: len(w.nodes[1].broker.connections)) == 1:
                break
            time.sleep(0.01)
        assert api("DELETE", f"/connections/username/{user[0]}") == (204, "")
        for conn in open_:
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="320"):
                for _ in range(500):
                    conn.process_data_events(0.01)
    finally:
        for conn in (gone, *open_):
            if conn.is_open:
                conn.close()


def test_queues_of_a_worker_that_is_down(workers: tuple[InProcessWorkers, Api]) -> None:
    w, api = workers
    w.call(lambda: w.meshes[0].links[1].close())
    down = f"home node 'leveret-1@localhost' of durable queue '{DURABLE}' in vhost '{VHOST}' is down or inaccessible"
    path = f"/queues/{VHOST}/{DURABLE}"
    status, doc = api("GET", path)
    assert (status, doc["state"], doc["worker"]) == (200, "down", 1)
    # RabbitMQ's API runs these as channel methods: 404 not_found with the channel
    # error's text (basic.get's with its code, as for a missing queue)
    assert api("DELETE", f"{path}/contents") == (404, {"error": "not_found", "reason": down})
    assert api("POST", f"{path}/get", body=GET_BODY) == (
        404,
        {"error": "not_found", "reason": f"NOT_FOUND - {down}"},
    )
    assert api("DELETE", path) == (404, {"error": "not_found", "reason": down})
    # a transient queue went with its node: missing
    path = f"/queues/{VHOST}/{TRANSIENT}"
    missing = (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api("DELETE", f"{path}/contents") == missing
    assert api("DELETE", path) == missing
    assert api("POST", f"{path}/get", body=GET_BODY) == (
        404,
        {"error": "not_found", "reason": f"NOT_FOUND - no queue '{TRANSIENT}' in vhost '{VHOST}'"},
    )
    # a declare: RabbitMQ's queue.declare of a queue whose home node is down
    assert api("PUT", f"/queues/{VHOST}/{DURABLE}", body={"durable": True}) == (
        404,
        {"error": "not_found", "reason": down},
    )
    # who may not ask is told so first, as for any queue
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}", ("wk-noperm", "pw")) == (
        401,
        {"error": "not_authorised", "reason": "User not authorised to access virtual host"},
    )
    assert api("DELETE", f"/queues/{VHOST}/{DURABLE}", ("wk-readonly", "pw")) == (
        401,
        {"error": "not_authorised", "reason": "Access refused."},
    )
    # nothing was deleted: the queue is worker 1's to keep
    assert w.call(lambda: DURABLE in w.nodes[0].broker.vhosts[VHOST].queues)
