"""`leveret server --workers N` with real processes: the supervisor, its workers, the
shared port, the mesh between them, restarts, stops and the errors of a bad start."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from leveret.workers.sockets import listening_group
from serverproc import server_argv
from workers.procs import alive, kill_and_wait, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


def closed_with(conn: pika.BlockingConnection) -> pika.exceptions.ConnectionClosedByBroker:
    """The broker's close of `conn`, read from the socket."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn.process_data_events(time_limit=0.1)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            return exc
    raise AssertionError("the broker did not close the connection")


def test_connections_land_on_both_workers_and_sigterm_closes_them_with_320(workers) -> None:
    broker = workers(2).wait_listening()
    conns = [broker.connect() for _ in range(24)]
    counts = [broker.connections_of(0), broker.connections_of(1)]
    assert sum(counts) == 24
    assert all(counts), f"every connection on one worker: {counts}"
    channel = conns[0].channel()
    channel.queue_declare("wk-proc-q")  # a worker serves AMQP, not only the handshake

    status = broker.status()
    assert [w["state"] for w in status["workers"]] == ["running", "running"]
    assert all(w["ready"] for w in status["workers"])
    pids = [w["pid"] for w in status["workers"]]

    broker.proc.send_signal(signal.SIGTERM)
    for conn in conns:
        exc = closed_with(conn)
        assert exc.reply_code == 320
        assert "CONNECTION_FORCED" in exc.reply_text
    assert broker.proc.wait(timeout=60) == 0
    assert not any(alive(pid) for pid in pids)
    log = broker.text()
    assert "worker 0 stopped (exit status 0)" in log
    assert "worker 1 stopped (exit status 0)" in log


def test_each_worker_keeps_its_store_and_logs_its_name(workers) -> None:
    broker = workers(3).wait_listening()
    data = broker.data
    assert json.loads((data / "workers.json").read_text())["workers"] == 3
    for i in range(3):
        assert (data / f"worker-{i}" / "definitions.db").exists()
        assert (data / f"worker-{i}" / "ctl.sock").exists()
    assert not (data / "definitions.db").exists()
    log = broker.text()
    assert re.search(r" worker 0 leveret\.server: accepting AMQP 0-9-1 on 127\.0\.0\.1:", log)
    assert re.search(r" worker 1 leveret\.server: accepting AMQP 0-9-1 on 127\.0\.0\.1:", log)

    # the mesh: each worker linked to each other one (links come up after the
    # listening line: a worker reads its links once it accepts)
    def meshed():
        """every worker linked to every other"""
        log = broker.text()
        return all(
            f" worker {i} leveret.workers: link to worker {j} up" in log
            for i in range(3)
            for j in range(3)
            if i != j
        )

    wait_for(meshed)
    # leveret ctl finds worker 0's socket under the broker's data dir
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(data), "list_vhosts"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "/" in out.stdout.split()
    # every worker gives clients the broker's one cluster name
    names = set()
    for _ in range(18):
        conn = broker.connect()
        names.add(conn._impl.server_properties["cluster_name"])
        conn.close()
    assert len(names) == 1
    assert names == {json.loads((data / "workers.json").read_text())["cluster_name"]}
    assert broker.stop() == 0


def test_a_killed_worker_is_restarted_relinked_and_serves_connections_that_waited(
    workers,
) -> None:
    broker = workers(2).wait_listening()
    first = broker.status()["workers"][1]
    survivor = broker.connect_to(0, "survivor")  # on worker 0 through the kill
    links_before = broker.text().count(" worker 0 leveret.workers: link to worker 1 up")
    assert links_before == 1

    os.kill(first["pid"], signal.SIGKILL)

    # Connections made meanwhile: those the kernel gives worker 1's socket wait in its
    # backlog (the supervisor keeps it open) and are served once worker 1 is back.
    results: list[object] = []
    waited: list[pika.BlockingConnection] = []

    def client(n: int) -> None:
        try:
            conn = broker.connect(f"waited-{n}")
            conn.channel().queue_declare("", exclusive=True)
            waited.append(conn)
            results.append("ok")
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            results.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()

    def restarted():
        """worker 1 running again, with a new pid, ready"""
        w = broker.status()["workers"][1]
        return w["pid"] != first["pid"] and w["state"] == "running" and w["ready"] and w

    again = wait_for(restarted)
    assert again["restarts"] == 1
    assert again["last_exit"] == -signal.SIGKILL
    for t in threads:
        t.join(60)
    assert results == ["ok"] * 16
    on_new_worker = [n for n in broker.connection_names(1) if n.startswith("waited-")]
    assert on_new_worker, "the new worker 1 serves none of the connections made meanwhile"
    for conn in waited:
        conn.close()

    # worker 0 got a new link to the new worker 1, and the new worker 1 one to worker 0
    wait_for(lambda: broker.text().count(" worker 0 leveret.workers: link to worker 1 up") == 2)
    log = broker.text()
    assert " worker 0 leveret.workers: link to worker 1 lost" in log
    assert log.count(" worker 1 leveret.workers: link to worker 0 up") == 2
    assert "worker 1 serves again" in log

    # both serve new connections, and worker 0's client never noticed
    conns = [broker.connect() for _ in range(16)]
    assert broker.connections_of(0) >= 1 and broker.connections_of(1) >= 1
    survivor.channel().queue_declare("", exclusive=True)
    for conn in conns:
        conn.close()
    survivor.close()
    assert broker.stop() == 0


def test_a_port_already_taken_is_a_clear_error(workers, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        broker = workers(2, "--port", str(port))
        assert broker.proc.wait(timeout=60) == 1
    assert not (broker.data / "workers.json").exists()  # the data dir stays unmarked
    log = broker.text()
    assert (
        f"cannot start: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
        in log
    )
    assert "another process listens there" in log
    assert "worker 0 started" not in log


def test_a_port_held_by_another_reuseport_group_is_refused(workers) -> None:
    """SO_REUSEPORT would let a second broker of the same user share the port: the
    probe refuses it."""
    group = listening_group("127.0.0.1", 0, "amqp", 2)
    try:
        broker = workers(2, "--port", str(group.port))
        assert broker.proc.wait(timeout=60) == 1
        assert "address already in use" in broker.text()
    finally:
        group.close()


def test_a_worker_that_cannot_start_stops_the_broker_with_its_error(workers) -> None:
    # Worker 0 runs Web MQTT; its port is taken, so worker 0 exits before it serves.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        web_mqtt = holder.getsockname()[1]
        broker = workers(2, "--web-mqtt-port", str(web_mqtt))
        rc = broker.proc.wait(timeout=60)
    log = broker.text()
    assert rc != 0
    assert re.search(r" worker 0 leveret: cannot start: .*address already in use", log, re.I), log
    assert "worker 0 could not start (exit status 1): stopping all" in log
    assert "Leveret listening for AMQP" not in log


def test_a_bad_data_dir_is_a_clear_error(workers, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    broker = workers(2, data="file")
    assert broker.proc.wait(timeout=60) != 0
    assert "cannot start:" in broker.text()
    assert "file" in broker.text()


def test_a_worker_whose_store_cannot_open_stops_the_broker(workers, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "worker-1").write_text("not a directory")
    broker = workers(2)
    rc = broker.proc.wait(timeout=60)
    log = broker.text()
    assert rc == 2, log
    assert re.search(r" worker 1 leveret: cannot start: .*worker-1", log), log
    assert "worker 1 could not start (exit status 2): stopping all" in log


def test_the_data_dir_keeps_its_worker_count(workers, tmp_path: Path) -> None:
    broker = workers(2).wait_listening()
    assert broker.stop() == 0
    three = workers(3)
    assert three.proc.wait(timeout=60) == 2
    assert "belongs to a broker of --workers 2" in three.text()
    one = workers(1)
    assert one.proc.wait(timeout=60) == 2
    assert one.text().count("belongs to a broker of --workers 2") == 2


def test_a_one_process_store_is_not_opened_by_workers(workers, tmp_path: Path) -> None:
    single = workers(1)
    wait_for(lambda: (tmp_path / "data" / "ctl.sock").exists())
    assert single.stop() == 0
    broker = workers(2)
    assert broker.proc.wait(timeout=60) == 2
    assert "holds a one-process broker's store" in broker.text()


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_workers_must_be_a_whole_number_from_1(value: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--workers", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "argument --workers:" in out.stderr
    assert ("must be at least 1" if value != "two" else "expected a whole number") in out.stderr


def test_listening_group_binds_every_worker_to_the_port_the_os_picked() -> None:
    group = listening_group("127.0.0.1", 0, "amqp", 3)
    try:
        assert group.port
        ports = {s.getsockname()[1] for per in group.sockets for s in per}
        assert ports == {group.port}
        assert all(
            s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
            for per in group.sockets
            for s in per
        )
        # a client reaches the group (the kernel queues it on one worker's socket)
        with socket.create_connection(("127.0.0.1", group.port), timeout=10):
            pass
    finally:
        group.close()


def test_workers_with_a_cluster_run_a_cluster_node(tmp_path: Path) -> None:
    """`--workers 2 --cluster-etcd`: one node of the cluster (its workers start once it
    leads: tests/cluster/test_workers_failover.py); with etcd unreachable it waits for
    it, and SIGTERM stops it cleanly."""
    proc = subprocess.Popen(
        server_argv(
            "--port", "0", "--data-dir", str(tmp_path / "d"),
            "--cluster-etcd", "http://127.0.0.1:1", workers=2,
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "cannot register with etcd yet" in line:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "cannot register with etcd yet" in text
    assert "cannot be combined" not in text


def test_tls_and_several_listeners_are_served_by_every_worker(workers, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    broker = workers(
        2,
        "--listen", "127.0.0.1:0", "--listen", "amqps://127.0.0.1:0",
        "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"),
    )  # fmt: skip
    broker.wait_listening()
    tls = re.search(
        r"Leveret listening for AMQP 0-9-1 over TLS on 127\.0\.0\.1:(\d+)", broker.text()
    )
    assert tls is not None
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    plain, secure = [], []
    for n in range(12):
        plain.append(broker.connect(f"plain-{n}"))
        secure.append(
            pika.BlockingConnection(
                pika.ConnectionParameters(
                    "127.0.0.1",
                    int(tls.group(1)),
                    ssl_options=pika.SSLOptions(context, "127.0.0.1"),
                    client_properties={"connection_name": f"tls-{n}"},
                )
            )
        )
    names = broker.connection_names(0) + broker.connection_names(1)
    assert sorted(names) == sorted(
        [f"plain-{n}" for n in range(12)] + [f"tls-{n}" for n in range(12)]
    )
    for worker in range(2):
        assert any(n.startswith("tls-") for n in broker.connection_names(worker)), worker
    for conn in plain + secure:
        conn.close()
    assert broker.stop() == 0


def test_workers_stop_when_their_supervisor_is_killed(workers) -> None:
    broker = workers(2).wait_listening()
    pids = [w["pid"] for w in broker.status()["workers"]]
    conn = broker.connect()
    broker.proc.kill()
    broker.proc.wait()
    exc = closed_with(conn)
    assert exc.reply_code == 320
    for pid in pids:
        wait_for(lambda pid=pid: not alive(pid))
    log = broker.text()
    assert "control channel to the supervisor ended (closed): stopping" in log


def test_worker_0_restarts_with_the_management_api(workers, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mgmt = s.getsockname()[1]
    broker = workers(2, "--management-port", str(mgmt)).wait_listening()

    def overview() -> dict | None:
        """the management API's overview"""
        request = urllib.request.Request(f"http://127.0.0.1:{mgmt}/api/overview")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except OSError:
            return None

    wait_for(overview)
    first = broker.status()["workers"][0]
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: broker.status()["workers"][0]["pid"] != first["pid"])
    wait_for(lambda: broker.status()["workers"][0]["ready"])
    assert (
        wait_for(overview)["cluster_name"]
        == json.loads((broker.data / "workers.json").read_text())["cluster_name"]
    )
    assert broker.stop() == 0


@pytest.mark.soak
def test_workers_killed_in_turn_while_clients_connect(workers, soak_rounds: int) -> None:
    """Each round SIGKILLs one worker while a client keeps connecting. A connection
    the killed worker had accepted is lost (its client retries, as a client with
    recovery does); every client gets served within a few tries, by a live worker or
    the restarted one, and the broker stops cleanly at the end. Restarts stay under
    the supervisor's limit (more than 10 in 60 s stop the broker) for up to 10
    rounds a minute."""
    broker = workers(2).wait_listening()
    stop = threading.Event()
    failures: list[list[BaseException]] = []
    served = [0]

    def clients() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            errors: list[BaseException] = []
            for _attempt in range(5):
                try:
                    conn = broker.connect(f"soak-{n}")
                    conn.channel().queue_declare("", exclusive=True)
                    conn.close()
                    served[0] += 1
                    break
                except pika.exceptions.AMQPError as exc:
                    errors.append(exc)
            else:
                failures.append(errors)

    thread = threading.Thread(target=clients)
    thread.start()
    try:
        for round_ in range(soak_rounds):
            kill_and_wait(broker, round_ % 2)
            start = served[0]
            wait_for(lambda start=start: served[0] > start + 4)
    finally:
        stop.set()
        thread.join(60)
    assert failures == []
    assert [w["restarts"] for w in broker.status()["workers"]] == [
        (soak_rounds + 1) // 2,
        soak_rounds // 2,
    ]
    assert broker.stop() == 0
