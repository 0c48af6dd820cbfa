"""Shovels through failures: SIGKILL of either broker, restarts, a cut network.

With on-confirm a message is acked at the source only once the destination
confirmed it, so whatever happens every message arrives at least once; a
message may arrive twice (the destination had it but its confirm was lost).
Each test counts both. The brokers are `leveret server` subprocesses (a killed
broker must be a real process); the kill loops are `soak` (CI runs a few
rounds, --soak-rounds=N more).
"""

from __future__ import annotations

import collections
import random
import time

import pytest
from links_support import Brokers, api, count, free_port, put_shovel, wait_for, wait_state

from clienthelp import TcpProxy
from leveret.client.blocking import connect

BODY = 200  # bytes


def body(i: int) -> bytes:
    return (b"%07d|" % i).ljust(BODY, b".")


def fill(url: str, queue: str, n: int) -> None:
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        step = 5000
        for start in range(0, n, step):
            ch.publish_many(
                [body(i) for i in range(start, min(n, start + step))],
                routing_key=queue,
                persistent=True,
            )


def collect(url: str, queue: str, n: int, timeout: float = 60.0) -> collections.Counter:
    """Consume until every one of the n bodies was seen (or `timeout` s of silence)."""
    seen: collections.Counter = collections.Counter()
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        with ch.consume(queue, prefetch=1000) as consumer:
            while len(seen) < n:
                try:
                    message = consumer.next_message(timeout)
                except TimeoutError:
                    break
                seen[message.body] += 1
                message.ack()
    return seen


def check(seen: collections.Counter, n: int) -> int:
    """Every message at least once; returns the number of duplicates."""
    missing = [i for i in range(n) if body(i) not in seen]
    assert not missing, f"{len(missing)} of {n} lost, e.g. {missing[:5]}"
    assert set(seen) == {body(i) for i in range(n)}
    return sum(seen.values()) - n


def managed(brokers: Brokers, name: str, data_dir=None):
    port = free_port()
    broker = brokers.new(data_dir, name=name, extra=("--management-port", str(port)))
    broker.management = f"http://127.0.0.1:{port}"
    return broker


@pytest.mark.soak
def test_sigkill_of_the_destination_mid_shovel_loses_nothing(tmp_path, soak_rounds):
    n = 20_000
    with Brokers(tmp_path) as brokers:
        src = managed(brokers, "src").start()
        dest = brokers.new(name="dest").start()
        fill(src.url, "jobs", n)
        put_shovel(
            src.management,
            "jobs",
            {
                "src-uri": src.url,
                "src-queue": "jobs",
                "dest-uri": dest.url,
                "dest-queue": "jobs",
                "reconnect-delay": 0.5,
            },
        )
        for _ in range(soak_rounds):
            wait_for(lambda: count(src.url, "jobs") < n - 1000, what="some progress")
            time.sleep(random.uniform(0.0, 0.3))
            dest.kill()
            time.sleep(random.uniform(0.0, 0.5))
            dest.start()
            if count(src.url, "jobs") == 0:
                break
        wait_for(lambda: count(src.url, "jobs") == 0, 120, "the source to drain")
        duplicates = check(collect(dest.url, "jobs", n), n)
        print(f"{n} messages, {soak_rounds} kills of the destination: {duplicates} duplicates")


@pytest.mark.soak
def test_sigkill_of_the_broker_running_the_shovel_resumes_after_restart(tmp_path, soak_rounds):
    n = 20_000
    with Brokers(tmp_path) as brokers:
        src = managed(brokers, "src").start()
        dest = brokers.new(name="dest").start()
        fill(src.url, "jobs", n)
        put_shovel(
            src.management,
            "jobs",
            {"src-uri": "amqp://", "src-queue": "jobs", "dest-uri": dest.url, "dest-queue": "jobs"},
        )
        for _ in range(soak_rounds):
            wait_for(lambda: count(dest.url, "jobs") > 0, what="some progress")
            time.sleep(random.uniform(0.0, 0.3))
            src.kill()
            src.start()
            wait_state(src.management, "jobs", "running", 60)  # the stored shovel is back
            if count(src.url, "jobs") == 0:
                break
        wait_for(lambda: count(src.url, "jobs") == 0, 120, "the source to drain")
        duplicates = check(collect(dest.url, "jobs", n), n)
        print(f"{n} messages, {soak_rounds} kills of the shovel's broker: {duplicates} duplicates")


def test_a_cut_network_between_the_brokers_loses_nothing(tmp_path):
    n = 20_000
    with Brokers(tmp_path) as brokers:
        src = managed(brokers, "src").start()
        dest = brokers.new(name="dest").start()
        proxy = TcpProxy("127.0.0.1", dest.port)
        try:
            fill(src.url, "jobs", n)
            put_shovel(
                src.management,
                "jobs",
                {
                    "src-uri": "amqp://",
                    "src-queue": "jobs",
                    "dest-uri": proxy.url(dest.url),
                    "dest-queue": "jobs",
                    "reconnect-delay": 0.5,
                },
            )
            for _ in range(3):
                before = count(dest.url, "jobs")
                wait_for(lambda b=before: count(dest.url, "jobs") > b, what="progress")
                proxy.cut()
            wait_for(lambda: count(src.url, "jobs") == 0, 120, "the source to drain")
            assert proxy.accepted >= 2  # it reconnected through the proxy
            duplicates = check(collect(dest.url, "jobs", n), n)
            print(f"{n} messages, 3 network cuts: {duplicates} duplicates")
        finally:
            proxy.close()


def test_a_stored_shovel_survives_a_clean_restart_and_ctl_manages_it(tmp_path):
    import subprocess
    import sys

    with Brokers(tmp_path) as brokers:
        b = managed(brokers, "b").start()
        ctl = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(b.data_dir)]
        value = (
            '{"src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp://", "dest-queue": "out"}'
        )
        done = subprocess.run(
            [*ctl, "set_parameter", "shovel", "keep", value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        bad = subprocess.run(
            [*ctl, "set_parameter", "shovel", "bad", '{"src-queue": "x"}'],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1
        assert 'Key "src-uri" not found in bad' in bad.stderr
        wait_state(b.management, "keep", "running")
        b.restart()
        wait_state(b.management, "keep", "running")
        fill(b.url, "in", 10)
        wait_for(lambda: count(b.url, "out") == 10, what="moved after the restart")
        listed = subprocess.run(
            [*ctl, "--formatter", "json", "list_parameters"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert '"component": "shovel"' in listed.stdout and '"name": "keep"' in listed.stdout
        status = subprocess.run(
            [*ctl, "--formatter", "json", "shovel_status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert '"state": "running"' in status.stdout
        cleared = subprocess.run(
            [*ctl, "clear_parameter", "shovel", "keep"], capture_output=True, text=True, timeout=60
        )
        assert cleared.returncode == 0, cleared.stderr
        assert api(b.management, "GET", "/api/shovels")[1] == []


def test_a_static_shovel_from_the_config_file(tmp_path):
    with Brokers(tmp_path) as brokers:
        dest = brokers.new(name="dest").start()
        config = tmp_path / "leveret.toml"
        config.write_text(
            "[shovels.from-config]\n"
            'src-uri = "amqp://"\n'
            'src-queue = "outbox"\n'
            f'dest-uri = "{dest.url}"\n'
            'dest-queue = "inbox"\n'
            "dest-add-forward-headers = true\n"
        )
        src = managed(brokers, "src")
        src.args += ["--config", str(config)]
        src.start()
        row = wait_state(src.management, "from-config", "running")
        assert row["type"] == "static"
        fill(src.url, "outbox", 50)
        wait_for(lambda: count(dest.url, "inbox") == 50, what="moved by the static shovel")
        # Not a parameter: it cannot be deleted, only restarted.
        assert api(src.management, "GET", "/api/parameters/shovel")[1] == []
        status, body = api(src.management, "DELETE", "/api/shovels/vhost/%2F/from-config")
        assert status == 400 and "static" in body["reason"]
        assert api(src.management, "DELETE", "/api/shovels/vhost/%2F/from-config/restart")[0] == 204
        wait_state(src.management, "from-config", "running")
        bad = tmp_path / "bad.toml"
        bad.write_text('[shovels.broken]\nsrc-queue = "x"\n')
        import subprocess

        from serverproc import server_argv

        done = subprocess.run(
            [
                *server_argv(
                    "--config", str(bad), "--port", "0", "--data-dir", str(tmp_path / "bad")
                )
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert "shovel 'broken'" in done.stderr and 'Key "src-uri" not found' in done.stderr


def test_a_federated_exchange_gets_what_was_published_while_its_broker_was_down(tmp_path):
    with Brokers(tmp_path) as brokers:
        up = brokers.new(name="up").start()
        down = managed(brokers, "down").start()
        with connect(up.url) as conn:
            conn.channel().declare_exchange("events", "fanout", durable=True)
        with connect(down.url) as conn:
            ch = conn.channel()
            ch.declare_exchange("events", "fanout", durable=True)
            ch.declare_queue("mine", durable=True)
            ch.bind_queue("mine", "events", "")
        api(
            down.management,
            "PUT",
            "/api/parameters/federation-upstream/%2F/up",
            {"value": {"uri": up.url, "reconnect-delay": 1}},
        )
        api(
            down.management,
            "PUT",
            "/api/policies/%2F/fed",
            {"pattern": "^events$", "definition": {"federation-upstream": "up"}},
        )
        wait_for(
            lambda: (
                [r["status"] for r in api(down.management, "GET", "/api/federation-links")[1]]
                == ["running"]
            ),
            what="the link",
        )
        down.stop()
        with connect(up.url) as conn:  # the upstream queue keeps these for the downstream
            conn.channel().publish_many(
                [b"while down %d" % i for i in range(20)], exchange="events", persistent=True
            )
        down.start()
        wait_for(lambda: count(down.url, "mine") == 20, 60, "what was published meanwhile")
