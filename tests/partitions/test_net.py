"""The harness's network faults on their own (no cluster): a lossy link drops about
the share it was given, a slow host's link is held back by its queueing discipline,
and a heal undoes both. A few seconds; skipped where namespaces cannot be made."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from .net import Net, why_unavailable

_why = why_unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=f"partition harness unavailable: {_why}")


@pytest.fixture
def net():
    n = Net()
    try:
        n.add("a")
        n.add("b")
        yield n
    finally:
        n.close()


def _udp_through(net: Net, count: int) -> int:
    """Datagrams a sends b, of `count`, that b receives."""
    b_ip = net.hosts["b"].ip

    def bind() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((b_ip, 0))
        return s

    rx = net.call("b", bind)  # a socket stays in the namespace it was made in
    port = rx.getsockname()[1]
    try:
        tx = net.call("a", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        with tx:
            for i in range(count):
                try:
                    tx.sendto(str(i).encode(), (b_ip, port))
                except PermissionError:
                    pass  # dropped by the sender's own nftables output chain: EPERM
        got = 0
        rx.settimeout(1.0)
        while True:
            try:
                rx.recv(64)
            except TimeoutError:
                return got
            got += 1
    finally:
        rx.close()


def test_a_lossy_link_drops_about_its_share_and_heals(net) -> None:
    assert _udp_through(net, 300) == 300
    net.lossy("a", "b", 40)
    assert net.faults() == ["a->b 40% loss", "b->a 40% loss"]
    got = _udp_through(net, 2000)
    # 1,200 expected; the bounds are 8 standard deviations (22) away
    assert 1025 < got < 1375, got
    net.heal("a", "b")
    assert net.faults() == []
    assert _udp_through(net, 300) == 300


def _qdisc(net: Net, host: str) -> str:
    return net.nsexec(net.hosts[host].ns, "tc", "-s", "qdisc", "show", "dev", "eth0")


def test_a_slow_host_is_held_back_by_its_qdisc_and_heals(net) -> None:
    """netem delay where the kernel has it, else a tbf rate limit; 96 KB from the slow
    host to the other arrive whole, and the rate limit (where it is the one) held some
    packets back (its `overlimits` counter), which is what slows the link."""
    b_ip = net.hosts["b"].ip
    data = bytes(range(256)) * 384

    def listen() -> socket.socket:
        s = socket.socket()
        s.bind((b_ip, 0))
        s.listen()
        return s

    srv = net.call("b", listen)
    port = srv.getsockname()[1]
    received = bytearray()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.extend(chunk)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    net.slow("a")
    assert net.faults() == ["a slow"]

    def send() -> None:
        with socket.create_connection((b_ip, port), timeout=30) as c:
            c.sendall(data)

    net.call("a", send, timeout=60)
    t.join(30)
    srv.close()
    assert bytes(received) == data
    stats = _qdisc(net, "a")
    if net.netem:
        assert "netem" in stats and "delay" in stats, stats
    else:
        assert "tbf" in stats and "rate 256Kbit" in stats, stats
        overlimits = re.search(r"overlimits (\d+)", stats)
        assert overlimits is not None and int(overlimits.group(1)) > 0, stats
    net.heal("a", "a")
    assert net.faults() == []
    stats = _qdisc(net, "a")
    assert "tbf" not in stats and "netem" not in stats, stats
