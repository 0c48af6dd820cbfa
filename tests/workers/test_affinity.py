"""Connection affinity with real `leveret server --workers 2` processes: a plain-TCP
connection whose queue another worker owns moves to that worker, socket and state,
and its client sees nothing; TLS connections, connections already holding what
cannot move, and a broker with affinity off keep their connections where they are."""

from __future__ import annotations

import os
import pickle
import re
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import body, commands

from leveret.ctl import call
from leveret.protocol import connection as pc
from leveret.protocol.frames import body_frames
from leveret.protocol.methods import encode_publish
from leveret.protocol.properties import EMPTY_PROPERTIES, content_header_frame
from leveret.protocol.states import OPEN
from rawamqp import RawClient, content_frames, method_frame
from serverproc import server_argv
from workers.procs import Workers, name_on, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


def linked(broker: Workers) -> Workers:
    """Waits until the two workers' links are up (a worker links just after it starts
    accepting, docs/workers.md), so methods that need the other worker find it."""
    wait_for(lambda: "worker 0 leveret.workers: link to worker 1 up" in broker.text())
    wait_for(lambda: "worker 1 leveret.workers: link to worker 0 up" in broker.text())
    return broker


def on_worker(broker: Workers, name: str) -> int | None:
    """The worker whose own ctl socket lists connection `name` (None: no worker's)."""
    found = [w for w in range(2) if name in broker.connection_names(w)]
    assert len(found) <= 1, f"{name} listed on workers {found}"
    return found[0] if found else None


def conn_name(conn: pika.BlockingConnection) -> str:
    return conn._impl.params.client_properties["connection_name"]


def moved(broker: Workers, name: str, to: int) -> bool:
    """connection `name` is on worker `to` alone"""
    return on_worker(broker, name) == to


def test_a_connection_moves_to_the_worker_of_its_queue_and_its_client_sees_nothing(
    workers,
) -> None:
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity-q")
    conn = broker.connect_to(0, "mover")
    name = conn_name(conn)
    # Several channels with state before the switch: confirm mode, qos, a plain one.
    confirms = conn.channel()
    confirms.confirm_delivery()
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=7)
    plain = conn.channel()
    plain.exchange_declare("amq.direct", "direct", passive=True)  # names no queue: no decision
    assert on_worker(broker, name) == 0

    ok = confirms.queue_declare(queue, durable=True)  # the switch
    assert ok.method.queue == queue and ok.method.message_count == 0
    wait_for(lambda: moved(broker, name, 1))
    # What worker 0 shows of the whole broker (ctl, as the management API: other
    # workers' reports are up to a second old) has it once, on worker 1.
    ctl0 = str(broker.data / "worker-0" / "ctl.sock")

    def shown_on_worker_1() -> bool:
        """worker 0's list of every worker's connections shows it on worker 1 alone"""
        rows = call(ctl0, "list_connections", {})
        return [r["worker"] for r in rows if r["connection_name"] == name] == [1]

    wait_for(shown_on_worker_1)
    log = broker.text()
    assert re.search(r"worker 0 leveret\.connection: connection \S+ handed to worker 1", log)
    assert re.search(r"worker 1 leveret\.connection: connection \S+ taken over from worker 0", log)

    # The same client goes on as if nothing happened: confirms numbered from 1.
    plain.queue_bind(queue, "amq.direct", "k")
    for n in range(20):
        confirms.basic_publish(
            "",
            queue,
            f"m{n}".encode(),
            pika.BasicProperties(delivery_mode=2),
            mandatory=True,
        )
    confirms.basic_publish("amq.direct", "k", b"via-x", mandatory=True)
    assert plain.queue_declare(queue, passive=True).method.message_count == 21

    got: list[bytes] = []

    def on_message(ch, method, _props, body) -> None:
        got.append(body)
        assert method.delivery_tag == len(got)  # the channel's tags start at 1 here too
        ch.basic_ack(method.delivery_tag)

    consumer.basic_consume(queue, on_message)
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got) == 21)
    assert got == [f"m{n}".encode() for n in range(20)] + [b"via-x"]
    assert plain.queue_declare(queue, durable=True).method.message_count == 0
    ch = conn.channel()  # a new channel after the switch
    assert ch.queue_declare(queue, passive=True).method.consumer_count == 1
    conn.close()
    wait_for(lambda: on_worker(broker, name) is None)
    assert broker.stop() == 0


def test_a_publish_to_the_default_exchange_moves_its_connection(workers) -> None:
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity-p")
    setup = broker.connect_to(1, "setup")
    setup.channel().queue_declare(queue)
    for attempt in range(64):  # heartbeats on, and a frame_max smaller than the body
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                broker.port,
                heartbeat=1,
                frame_max=8192,
                client_properties={"connection_name": f"publisher-{attempt}"},
            )
        )
        name = conn_name(conn)
        if on_worker(broker, name) == 0:
            break
        conn.close()
    ch = conn.channel()
    ch.confirm_delivery()
    big = bytes(range(256)) * 100  # 25,600 bytes: four body frames
    # The first publish decides: it (re-encoded from what the core parsed) and the
    # rest arrive on worker 1.
    ch.basic_publish("", queue, big)
    for n in range(5):
        ch.basic_publish("", queue, f"p{n}".encode())
    wait_for(lambda: moved(broker, name, 1))
    check = setup.channel()
    assert check.queue_declare(queue, passive=True).method.message_count == 6
    assert [check.basic_get(queue, auto_ack=True)[2] for _ in range(6)] == [big] + [
        f"p{n}".encode() for n in range(5)
    ]
    conn.sleep(3)  # heartbeats go on from worker 1 (a missed one closes the connection)
    assert conn.is_open
    ch.basic_publish("", queue, b"after")
    conn.close()
    setup.close()
    assert broker.stop() == 0


def test_a_connection_that_consumes_first_stays_where_it_is(workers) -> None:
    broker = linked(workers(2).wait_listening())
    local = name_on(0, "wk-affinity-l")
    remote = name_on(1, "wk-affinity-r")
    conn = broker.connect_to(0, "consumer")
    name = conn_name(conn)
    ch = conn.channel()
    ch.queue_declare(local)  # decided: its queue is here
    ch.basic_consume(local, lambda *a: None)
    ch.queue_declare(remote)  # later methods never move it (it has a consumer, too)
    ch.basic_publish("", remote, b"x")
    conn.process_data_events(time_limit=0.2)
    assert on_worker(broker, name) == 0
    assert "handed to worker" not in broker.text()
    conn.close()
    assert broker.stop() == 0


def test_affinity_off_keeps_every_connection_on_its_worker(workers) -> None:
    broker = linked(workers(2, "--worker-affinity", "off").wait_listening())
    queue = name_on(1, "wk-affinity-off")
    conn = broker.connect_to(0, "stayer")
    name = conn_name(conn)
    conn.channel().queue_declare(queue)
    conn.process_data_events(time_limit=0.2)
    assert on_worker(broker, name) == 0
    assert "handed to worker" not in broker.text()
    conn.close()
    assert broker.stop() == 0


def test_a_tls_connection_is_not_handed_over(workers, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    broker = workers(
        2,
        "--tls-port", "0",
        "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"),
    )  # fmt: skip
    linked(broker.wait_listening())
    tls = re.search(
        r"Leveret listening for AMQP 0-9-1 over TLS on 127\.0\.0\.1:(\d+)", broker.text()
    )
    assert tls is not None
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    queues = {w: name_on(w, "wk-affinity-tls") for w in range(2)}
    conns = []
    for n in range(8):  # some land on each worker; none moves
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                int(tls.group(1)),
                ssl_options=pika.SSLOptions(context, "127.0.0.1"),
                client_properties={"connection_name": f"tls-{n}"},
            )
        )
        conns.append(conn)
    where = {f"tls-{n}": on_worker(broker, f"tls-{n}") for n in range(8)}
    for n, conn in enumerate(conns):
        other = 1 - where[f"tls-{n}"]  # the queue of the worker it is not on
        ch = conn.channel()
        ch.queue_declare(queues[other])
        ch.basic_publish("", queues[other], b"tls")
    for n in range(8):
        assert on_worker(broker, f"tls-{n}") == where[f"tls-{n}"]
    assert "handed to worker" not in broker.text()
    for conn in conns:
        conn.close()
    assert broker.stop() == 0


def test_the_receiving_worker_killed_during_a_handoff(workers) -> None:
    """Worker 1 is stopped (SIGSTOP) so the handoff waits in its channel, then killed:
    the client sees its connection close, reconnects, and finds every message it had
    confirmed."""
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity-k")
    first = broker.connect()
    ch = first.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    for n in range(50):
        ch.basic_publish("", queue, f"c{n}".encode(), pika.BasicProperties(delivery_mode=2))
    first.close()

    mover = broker.connect_to(0, "killed")
    moving = mover.channel()
    pid = broker.status()["workers"][1]["pid"]
    os.kill(pid, signal.SIGSTOP)
    # `first` may have been handed to worker 1 too: wait for the mover's handoff
    handed_before = broker.text().count("handed to worker 1")

    def kill_once_handed() -> None:
        try:
            wait_for(lambda: broker.text().count("handed to worker 1") > handed_before)
        finally:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_handed)
    killer.start()
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            moving.queue_declare(queue, passive=True)  # handed to the stopped worker
    finally:
        killer.join()
    wait_for(lambda: broker.status()["workers"][1]["pid"] != pid)
    wait_for(lambda: broker.status()["workers"][1]["ready"])

    # The restarted worker has new handoff channels: connections move to it again.
    wait_for(lambda: broker.text().count("worker 0 leveret.workers: link to worker 1 up") >= 2)
    again = broker.connect_to(0, "after")
    ch = again.channel()
    assert ch.queue_declare(queue, durable=True, passive=True).method.message_count == 50
    assert [ch.basic_get(queue, auto_ack=True)[2] for _ in range(50)] == [
        f"c{n}".encode() for n in range(50)
    ]
    assert moved(broker, conn_name(again), 1)
    again.close()
    assert broker.stop() == 0


def test_the_core_state_moves_only_between_frames() -> None:
    """export_state refuses a connection that is not open or has a content half read;
    import_state makes a new core open with the same channels and sizes."""
    core = pc.Connection(pc.SERVER)
    with pytest.raises(ValueError):
        core.export_state()
    state = {
        "frame_max": 8192,
        "channel_max": 16,
        "heartbeat": 0,
        "username": "guest",
        "vhost": "/",
        "client_properties": {"product": "x"},
        "channels": [1, 3],
    }
    core.import_state(state)
    assert core.state == OPEN and core.open_channels == [1, 3]
    assert core.export_state() == state
    # A whole frame of a publish still waiting for its body's rest is not pending
    # input any more: the core holds the content, and the connection cannot move.
    publish = b"".join(
        [
            encode_publish(1, "", "q"),
            content_header_frame(1, 10000, EMPTY_PROPERTIES),
            *body_frames(1, b"x" * 8000, 8192),
        ]
    )
    assert list(core.receive_data(publish)) == []
    with pytest.raises(ValueError, match="channel 1"):
        core.export_state()


def test_a_bad_affinity_setting_is_refused_with_its_name() -> None:
    proc = subprocess.run(
        server_argv("--port", "0", "--worker-affinity", "maybe", workers=2),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--worker-affinity" in proc.stderr and "expected on or off, got 'maybe'" in proc.stderr


def test_methods_pipelined_behind_the_deciding_one_move_with_it(workers) -> None:
    """A client that sends many methods in one write (channel.open, qos, confirm,
    declare, consume, publishes, half a frame): what the first worker read and had
    not handled is handled on the second, in order."""
    broker = linked(workers(2).wait_listening())
    queue = name_on(1, "wk-affinity-pipe")
    for _attempt in range(64):
        client = RawClient("127.0.0.1", broker.port, timeout=30)
        client.handshake()
        peer = f"127.0.0.1:{client.sock.getsockname()[1]}"
        ctl = str(broker.data / "worker-0" / "ctl.sock")
        rows = call(ctl, "list_connections", {})
        if any(r["name"] == peer and r.get("worker", 0) == 0 for r in rows):
            break
        client.sock.close()
    client.open_channel(1)
    burst = b"".join(
        [
            method_frame(1, commands.Basic.Qos(prefetch_count=10)),
            method_frame(2, commands.Channel.Open()),
            method_frame(2, commands.Confirm.Select()),
            method_frame(2, commands.Queue.Declare(queue=queue)),  # decides
            method_frame(2, commands.Basic.Consume(queue=queue, no_ack=True)),
            *(
                method_frame(2, commands.Basic.Publish(routing_key=queue))
                + content_frames(2, f"b{n}".encode())
                for n in range(3)
            ),
        ]
    )
    last = method_frame(2, commands.Basic.Publish(routing_key=queue)) + content_frames(2, b"b3")
    client.send(burst + last[:10])  # the last publish's start: a frame cut in two
    client.wait_for(commands.Basic.QosOk, channel=1)
    client.wait_for(commands.Channel.OpenOk, channel=2)
    client.wait_for(commands.Confirm.SelectOk, channel=2)
    _, ok = client.wait_for(commands.Queue.DeclareOk, channel=2)
    assert ok.queue == queue
    client.wait_for(commands.Basic.ConsumeOk, channel=2)
    wait_for(lambda: on_worker_by_peer(broker, peer) == 1)
    client.send(last[10:])
    bodies, confirmed = [], 0
    while len(bodies) < 4 or confirmed < 4:
        _, frame = client.wait_for(commands.Basic.Deliver, commands.Basic.Ack, body.ContentBody)
        if isinstance(frame, body.ContentBody):
            bodies.append(frame.value)
        elif isinstance(frame, commands.Basic.Ack):
            confirmed = frame.delivery_tag  # numbered from 1 on the channel, as sent
    assert bodies == [b"b0", b"b1", b"b2", b"b3"]
    assert confirmed == 4
    client.sock.close()
    assert broker.stop() == 0


def on_worker_by_peer(broker: Workers, peer: str) -> int | None:
    """The worker whose own ctl socket lists the connection from `peer`."""
    found = []
    for w in range(2):
        rows = call(str(broker.data / f"worker-{w}" / "ctl.sock"), "list_connections", {})
        if any(r["name"] == peer and r.get("worker", w) == w for r in rows):
            found.append(w)
    assert len(found) <= 1
    return found[0] if found else None


def test_what_keeps_a_channel_and_what_its_state_carries(tmp_path: Path) -> None:
    """On a one-process broker's real connection: the channel states that cannot move
    are named, and export_state/import_state carry a connection's channels (numbers,
    tags, confirm sequence numbers, qos, tx mode) into a new connection object."""
    from leveret.server.connection import AMQPConnection
    from leveret.testing import embedded_broker

    with embedded_broker(data_dir=str(tmp_path / "one")) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        consuming, getting, tx, confirms, plain = (conn.channel() for _ in range(5))
        consuming.queue_declare("wk-affinity-a")
        consuming.basic_consume("wk-affinity-a", lambda *a: None)
        getting.queue_declare("wk-affinity-b")
        getting.basic_publish("", "wk-affinity-b", b"x")
        assert getting.basic_get("wk-affinity-b")[0].delivery_tag == 1  # not acked
        tx.tx_select()
        tx.basic_publish("", "wk-affinity-b", b"in a transaction")
        confirms.confirm_delivery()
        confirms.basic_publish("", "wk-affinity-b", b"confirmed")  # seq 1, confirmed
        plain.basic_qos(prefetch_count=3)
        server_conn = next(iter(broker.server.connections))

        def reasons():
            return {n: ch.cannot_move() for n, ch in server_conn.channels.items()}

        assert broker.call(reasons) == {
            1: "a channel has consumers",
            2: "a channel has unacked deliveries",
            3: "a channel has an open transaction",
            4: None,
            5: None,
        }

        def round_trip():
            state = server_conn.export_state(b"unparsed")
            state = pickle.loads(pickle.dumps(state))
            copy = AMQPConnection(broker.server.listener)
            copy.import_state(state)
            return (
                state,
                {
                    n: (ch.delivery_tag, ch.confirm_mode, ch.publish_seq, ch.prefetch_count)
                    for n, ch in copy.channels.items()
                },
                copy.core.export_state(),
            )

        state, channels, core = broker.call(round_trip)
        assert state["input"] == b"unparsed" and state["user"] == "guest"
        assert channels == {
            1: (0, False, 0, 0),
            2: (1, False, 0, 0),
            3: (0, False, 0, 0),
            4: (0, True, 1, 0),
            5: (0, False, 0, 3),
        }
        assert core == server_conn.core.export_state()
        assert core["channels"] == [1, 2, 3, 4, 5]
        conn.close()


def test_a_handoff_that_cannot_be_sent_leaves_the_connection_serving_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The handoff channel refuses the send (its reader shut down): the connection
    stays, the deciding method and what follows it are handled where they were read,
    and the client sees nothing."""
    import asyncio
    import socket

    from leveret.testing import embedded_broker
    from leveret.workers.affinity import Handoffs
    from leveret.workers.mesh import local_meshes

    with embedded_broker(data_dir=str(tmp_path / "one")) as broker:
        ends: list[socket.socket] = []

        async def arm() -> Handoffs:
            meshes = await local_meshes(2)  # worker 0 (this broker) linked to a worker 1
            handoffs = Handoffs(meshes[0], lambda sock, state: sock.close())
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            handoffs.attach(1, ours)
            theirs.shutdown(socket.SHUT_RD)  # a send gets EPIPE; no end of stream to read
            ends.append(theirs)
            broker.server.listener.handoffs = handoffs
            return handoffs

        handoffs = asyncio.run_coroutine_threadsafe(arm(), broker.loop).result(10)
        queue = name_on(1, "wk-affinity-fail")
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        assert ch.queue_declare(queue).method.queue == queue  # decided, send failed
        ch.basic_publish("", queue, b"here")
        assert ch.queue_declare(queue, passive=True).method.message_count == 1
        assert handoffs.sent == 0
        assert len(broker.server.connections) == 1
        assert "stays: handoff to worker 1 failed" in caplog.text  # the path this tests
        conn.close()
        ends[0].close()
