"""Vhost and user limits of `leveret server --workers 2` hold for the whole broker.

A vhost's and a user's `max-connections` count the connections of every worker
(worker 0 holds the count: workers/limits.py), AMQP and MQTT alike, with the refusal
of one process; a worker's connections stop counting when it is SIGKILLed. A vhost's
`max-queues` counts queues declared through any worker (worker 0 validates every
declaration).
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest

from clienthelp import free_port
from leveret.ctl import call
from leveret.mqtt.session import queue_names
from leveret.workers.mesh import placement
from workers.procs import Workers, kill_and_wait, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

VHOST = "wk-limits-v"
USER = "wk-limits-u"
PASSWORD = "wk-limits-pw"


def ctl(broker: Workers, op: str, worker: int = 0, **args) -> object:
    return call(str(broker.data / f"worker-{worker}" / "ctl.sock"), op, args)


def everywhere(broker: Workers, fence: str) -> None:
    """Wait until worker 1 applied what worker 0 was told before (admin changes reach
    the other workers in order: a user added last is there once all before it are)."""
    ctl(broker, "add_user", name=fence, password="x")

    def applied() -> bool:
        """worker 1 has the fence user"""
        return any(row["name"] == fence for row in ctl(broker, "list_users", worker=1))

    wait_for(applied)


def setup_vhost(broker: Workers, limits: dict) -> None:
    ctl(broker, "add_vhost", name=VHOST)
    perm = {"configure": ".*", "write": ".*", "read": ".*"}
    ctl(broker, "set_permissions", user="guest", vhost=VHOST, **perm)
    ctl(broker, "set_vhost_limits", name=VHOST, limits=limits)
    everywhere(broker, "wk-limits-fence-v")


def setup_user(broker: Workers, limits: dict) -> None:
    ctl(broker, "add_user", name=USER, password=PASSWORD)
    perm = {"configure": ".*", "write": ".*", "read": ".*"}
    ctl(broker, "set_permissions", user=USER, vhost="/", **perm)
    ctl(broker, "set_user_limits", name=USER, limits=limits)
    everywhere(broker, "wk-limits-fence-u")


def amqp(broker: Workers, name: str, vhost: str = VHOST, user: str = "guest", pw: str = "guest"):
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.port,
            vhost,
            pika.PlainCredentials(user, pw),
            heartbeat=0,
            socket_timeout=30,
            connection_attempts=1,
            client_properties={"connection_name": name},
        )
    )


def worker_of(broker: Workers, names: list[str]) -> dict[str, int]:
    """The worker of each named connection (each worker's own list, which is current)."""
    return {n: w for w in (0, 1) for n in broker.connection_names(w) if n in names}


def spread(broker: Workers, n: int, prefix: str, **kw) -> dict[str, pika.BlockingConnection]:
    """`n` open connections (by name) with some on each worker; those made on the way
    that would leave one worker without any are closed."""
    conns: dict[str, pika.BlockingConnection] = {}
    for attempt in range(200):
        if len(conns) == n:
            where = worker_of(broker, list(conns))
            if set(where.values()) == {0, 1}:
                return conns
            conns.pop(list(conns)[-1]).close()
        name = f"{prefix}-{attempt}"
        # (a slot just freed may take worker 0 a moment to count as free)
        conns[name] = wait_for(lambda name=name: _try(broker, name, **kw))
    raise AssertionError("no spread of connections over both workers")


def refusals_by_worker(broker: Workers, text: str) -> set[int]:
    return {
        int(m.group(1))
        for m in re.finditer(
            r"worker (\d) leveret\.\S+: closing connection .*?: (.*)", broker.text()
        )
        if text in m.group(2)
    }


def refuse_on_both(broker: Workers, text: str, **kw) -> None:
    """New connections are refused with `text`, on both workers (the kernel spreads
    them: try until each worker refused one)."""
    for attempt in range(64):
        with pytest.raises(pika.exceptions.AMQPConnectionError) as err:
            amqp(broker, f"refused-{attempt}", **kw)
        assert text in str(err.value)
        if refusals_by_worker(broker, text) == {0, 1}:
            return
    raise AssertionError(f"not refused on both workers: {refusals_by_worker(broker, text)}")


def test_vhost_connection_limit_counts_every_worker(workers, tmp_path: Path) -> None:
    broker = workers(2).wait_listening()
    setup_vhost(broker, {"max-connections": 4})
    conns = spread(broker, 4, "wk-lim-a")
    text = f"access to vhost '{VHOST}' refused for user 'guest': connection limit (4) is reached"
    refuse_on_both(broker, text)
    # pika reports the connection.close it got while opening: code and text
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        amqp(broker, "refused-code")
    assert f'(530) "NOT_ALLOWED - {text}"' in str(err.value)

    # Closing one admits one more (on whichever worker), and no more than that.
    name = next(iter(conns))
    conns.pop(name).close()
    wait_for(lambda: conns.setdefault("wk-lim-again", _try(broker, "wk-lim-again")) or None)
    assert conns["wk-lim-again"] is not None
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        amqp(broker, "refused-after")

    # A SIGKILLed worker's connections count no more once it is back.
    where = worker_of(broker, list(conns))
    lost = [n for n, w in where.items() if w == 1]
    assert lost
    kill_and_wait(broker, 1)
    for n in lost:
        conns.pop(n)
    opened = []
    for i in range(40):
        conn = _try(broker, f"wk-lim-after-kill-{i}")
        if conn is not None:
            opened.append(conn)
        if len(opened) == len(lost):
            break
    assert len(opened) == len(lost)
    refuse_on_both(broker, text)
    for conn in [*conns.values(), *opened]:
        conn.close()


def _try(broker: Workers, name: str, **kw) -> pika.BlockingConnection | None:
    try:
        return amqp(broker, name, **kw)
    except pika.exceptions.AMQPConnectionError:
        return None


def test_concurrent_connects_admit_exactly_the_limit(workers) -> None:
    broker = workers(2).wait_listening()
    setup_vhost(broker, {"max-connections": 5})
    opened: list[pika.BlockingConnection] = []
    refused: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def connect(i: int) -> None:
        start.wait()
        try:
            conn = amqp(broker, f"wk-lim-c-{i}")
        except pika.exceptions.AMQPConnectionError as exc:
            with lock:
                refused.append(str(exc))
            return
        with lock:
            opened.append(conn)

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 5
    assert len(refused) == 11
    assert all("connection limit (5) is reached" in r for r in refused)
    on = worker_of(broker, [f"wk-lim-c-{i}" for i in range(16)])
    assert len(on) == 5
    for conn in opened:
        conn.close()


def test_user_connection_limit_counts_mqtt_and_amqp_on_every_worker(workers) -> None:
    port = free_port()
    broker = workers(2, "--mqtt-port", str(port)).wait_listening()
    setup_user(broker, {"max-connections": 2})

    def mqtt_client(client_id: str) -> tuple[mqtt.Client, int]:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        client.username_pw_set(USER, PASSWORD)
        result: list[int] = []
        client.on_connect = lambda c, u, flags, rc, props: result.append(rc.value)
        client.connect("127.0.0.1", port)
        client.loop_start()
        wait_for(lambda: result)
        return client, result[0]

    # One MQTT client served by each worker (the worker of its client id).
    ids = [_client_id_on(w, "wk-lim-mq") for w in (0, 1)]
    clients = []
    for cid in ids:
        client, rc = mqtt_client(cid)
        assert rc == 0
        clients.append(client)
    # A third is refused on either worker: CONNACK 5, as one process answers.
    for w in (0, 1):
        client, rc = mqtt_client(_client_id_on(w, f"wk-lim-mq-x{w}"))
        assert rc == 135  # paho reports 3.1.1's CONNACK 5 (not authorized) as 135
        client.loop_stop()
        client.disconnect()
    # And an AMQP connection of the user, on any worker.
    text = f"connection refused for user '{USER}': user connection limit (2) is reached"
    refuse_on_both(broker, text, vhost="/", user=USER, pw=PASSWORD)
    # One leaves: one comes in.
    clients[1].disconnect()
    clients[1].loop_stop()
    conn = wait_for(lambda: _try(broker, "wk-lim-u-again", vhost="/", user=USER, pw=PASSWORD))
    client, rc = mqtt_client(_client_id_on(1, "wk-lim-mq-y"))
    assert rc == 135
    client.loop_stop()
    conn.close()
    clients[0].disconnect()
    clients[0].loop_stop()


def _client_id_on(worker: int, prefix: str) -> str:
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if placement("/", queue_names(name)[1], 2) == worker:
            return name
    raise AssertionError(f"no client id from {prefix!r} for worker {worker}")


def test_vhost_queue_limit_counts_queues_of_every_worker(workers) -> None:
    broker = workers(2).wait_listening()
    setup_vhost(broker, {"max-queues": 3})
    conns = spread(broker, 2, "wk-lim-q")
    chans = {worker_of(broker, [n])[n]: c.channel() for n, c in conns.items()}
    # Named queues owned by each worker, and a server-named one, through both workers.
    for i, owner in enumerate((0, 1)):
        name = next(
            f"wk-lim-q{i}-{j}"
            for j in range(1000)
            if placement(VHOST, f"wk-lim-q{i}-{j}", 2) == owner
        )
        chans[1 - owner].queue_declare(name)
    chans[0].queue_declare("", exclusive=True)
    for w in (0, 1):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            chans[w].queue_declare(f"wk-lim-q-over-{w}")
        assert err.value.reply_code == 406
        assert f"queue limit in vhost '{VHOST}' (3) is reached" in err.value.reply_text
    for conn in conns.values():
        conn.close()


def test_user_channel_limit_counts_channels_of_every_worker(workers) -> None:
    broker = workers(2).wait_listening()
    setup_user(broker, {"max-channels": 3})
    login = {"vhost": "/", "user": USER, "pw": PASSWORD}
    text = (
        f"NOT_ALLOWED - number of channels opened for user '{USER}' has reached the "
        "maximum allowed user limit of (3)"
    )

    def refused(conn: pika.BlockingConnection) -> None:
        """One more channel closes the connection (530), as on one process."""
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            conn.channel()
        assert (err.value.reply_code, err.value.reply_text) == (530, text)

    conn0, _ = _channels_on(broker, 0, 2, "wk-lim-ch0", **login)
    conn1, _ = _channels_on(broker, 1, 1, "wk-lim-ch1", **login)
    refused(conn1)  # worker 1 asks worker 0, which counts its own 2
    # conn1's channel is gone with it: one more on worker 1 fills the limit again
    conn1, chans1 = _channels_on(broker, 1, 1, "wk-lim-ch1b", **login)
    refused(conn0)  # worker 0 counts worker 1's channel
    # conn0's 2 channels are gone: worker 1 takes 2 more (3 in all), then no more
    conn1b, chans1b = _channels_on(broker, 1, 2, "wk-lim-ch1c", **login)
    refused(_connection_on(broker, 0, "wk-lim-probe0", **login))
    # a channel closed on worker 1 frees a slot, which worker 0 takes
    chans1[0].close()
    conn0, _ = _channels_on(broker, 0, 1, "wk-lim-ch0b", **login)
    refused(_connection_on(broker, 1, "wk-lim-probe1", **login))
    refused(conn0)
    for conn in (conn1, conn1b):
        conn.close()


def _channels_on(
    broker: Workers, worker: int, n: int, prefix: str, **kw
) -> tuple[pika.BlockingConnection, list]:
    """A connection on `worker` with `n` channels; tried again while slots freed by
    connections that just closed are not yet counted free."""
    for attempt in range(100):
        conn = _connection_on(broker, worker, f"{prefix}-{attempt}", **kw)
        try:
            return conn, [conn.channel() for _ in range(n)]
        except pika.exceptions.ConnectionClosedByBroker:
            continue
    raise AssertionError(f"no {n} channels on worker {worker}")


def _connection_on(broker: Workers, worker: int, prefix: str, **kw) -> pika.BlockingConnection:
    for attempt in range(64):
        name = f"{prefix}-{attempt}"
        conn = wait_for(lambda name=name: _try(broker, name, **kw))
        if name in broker.connection_names(worker):
            return conn
        conn.close()
    raise AssertionError(f"64 connections and none on worker {worker}")


def test_a_connection_moved_to_its_queues_worker_keeps_counting(workers) -> None:
    """Affinity hands a connection to the worker of its queue: its connection and its
    channels count there, once."""
    broker = workers(2).wait_listening()
    setup_vhost(broker, {"max-connections": 2})
    setup_user(broker, {"max-channels": 2})
    perm = {"configure": ".*", "write": ".*", "read": ".*"}
    ctl(broker, "set_permissions", user=USER, vhost=VHOST, **perm)
    everywhere(broker, "wk-limits-fence-p")
    login = {"user": USER, "pw": PASSWORD}
    mover = _connection_on(broker, 0, "wk-lim-mover", **login)
    name = next(n for n in broker.connection_names(0) if n.startswith("wk-lim-mover"))
    queue = next(
        f"wk-lim-mq-{j}" for j in range(1000) if placement(VHOST, f"wk-lim-mq-{j}", 2) == 1
    )
    mover.channel().queue_declare(queue, exclusive=False, auto_delete=False)
    wait_for(lambda: name in broker.connection_names(1) and name not in broker.connection_names(0))
    other = wait_for(lambda: _try(broker, "wk-lim-other", **login))
    text = f"access to vhost '{VHOST}' refused for user '{USER}': connection limit (2) is reached"
    refuse_on_both(broker, text, **login)
    other.channel()  # the mover's channel and this one: the user's 2
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        other.channel()
    assert err.value.reply_code == 530
    assert "maximum allowed user limit of (2)" in err.value.reply_text
    mover.close()
    for i in range(2):  # both slots free again (the mover's and the refused one's)
        wait_for(lambda i=i: _try(broker, f"wk-lim-after-move-{i}", **login))


def test_a_restarted_worker_0_learns_the_other_workers_connections(workers) -> None:
    """Worker 0 holds the count: after its SIGKILL the other workers report what they
    hold, so the limit still counts their connections, and no longer worker 0's."""
    broker = workers(2).wait_listening()
    setup_vhost(broker, {"max-connections": 4})
    conns = spread(broker, 4, "wk-lim-w0")
    on_1 = [n for n, w in worker_of(broker, list(conns)).items() if w == 1]
    kill_and_wait(broker, 0)
    opened = []
    for i in range(200):
        if len(opened) == 4 - len(on_1):
            break
        conn = _try(broker, f"wk-lim-w0-after-{i}")
        if conn is not None:
            opened.append(conn)
    assert len(opened) == 4 - len(on_1)
    text = f"access to vhost '{VHOST}' refused for user 'guest': connection limit (4) is reached"
    refuse_on_both(broker, text)
    assert sorted(n for n in broker.connection_names(1) if n in conns) == sorted(on_1)
