"""The supervisor's liveness rule (`workers/liveness.py`), the notes that carry its
pings (`handoff.send_note`), and the option that sets it. The rule runs on times
given to it, so every case here is exact; `test_worker_hang.py` runs it on real
processes."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys

import pytest

from leveret.workers import handoff
from leveret.workers.control import ping_seq, send_ping
from leveret.workers.liveness import DEFAULT_TIMEOUT, Liveness
from leveret.workers.supervisor import Supervisor


def test_no_ping_and_no_kill_before_a_worker_is_ready() -> None:
    """A worker reading its store back is not watched, however long it takes."""
    live = Liveness(timeout=6.0, interval=1.0)
    for second in range(1000):
        assert live.tick(float(second)) == ([], [])


def test_a_ready_worker_is_pinged_at_once_then_every_interval() -> None:
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(1, now=0.0)
    assert live.tick(0.0) == ([(1, 1)], [])
    assert live.tick(0.5) == ([], [])
    live.answered(1, 1, now=0.6)
    assert live.tick(1.0) == ([(1, 2)], [])


def test_a_worker_that_keeps_answering_is_never_hung() -> None:
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(0, now=0.0)
    for second in range(1, 500):
        pings, hung = live.tick(float(second))
        assert hung == []
        for index, seq in pings:
            live.answered(index, seq, now=second + 0.9)  # late, but within the timeout


def test_a_slow_answer_within_the_timeout_is_enough() -> None:
    """One answer per timeout keeps a worker (a long fsync delays a few pings)."""
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(0, now=0.0)
    for second in range(6):
        assert live.tick(float(second))[1] == []
    live.answered(0, 1, now=5.9)  # the first ping's answer, just in time
    for second in range(6, 12):
        assert live.tick(float(second))[1] == []
    assert live.tick(12.0)[1] == [(0, pytest.approx(6.1))]


def test_silence_for_the_timeout_is_hung_reported_once() -> None:
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(0, now=0.0)
    live.ready(1, now=0.0)
    hung: list = []
    for second in range(10):
        pings, newly = live.tick(float(second))
        hung += newly
        for index, seq in pings:
            if index == 0:
                live.answered(index, seq, now=float(second))
    assert hung == [(1, 7.0)]  # first tick past 6 s of silence, and only once
    # its process exits; the next one is watched afresh from its ready
    live.gone(1)
    live.ready(1, now=10.0)
    assert live.tick(10.0) == ([(0, 11), (1, 1)], [])


def test_an_answer_to_a_ping_not_sent_counts_for_nothing() -> None:
    """Numbers start again with each process: an answer it could not have given
    (a number above the last ping sent) does not reset the clock."""
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(0, now=0.0)
    live.tick(0.0)
    live.answered(0, 5, now=5.0)
    live.answered(0, 0, now=5.0)
    hung = []
    for second in range(1, 8):
        hung += live.tick(float(second))[1]
    assert hung == [(0, 7.0)]


def test_a_supervisor_that_did_not_run_starts_every_clock_again() -> None:
    """A supervisor stopped (or starved) for longer than the timeout could not read
    the answers of that time: its workers are not killed for its silence."""
    live = Liveness(timeout=6.0, interval=1.0)
    live.ready(0, now=0.0)
    assert live.tick(0.0) == ([(0, 1)], [])
    assert live.tick(100.0) == ([(0, 2)], [])
    live.answered(0, 2, now=100.1)
    assert live.tick(101.0)[1] == []
    # and without an answer after that, the timeout counts from the late tick
    hung = []
    for second in range(102, 108):
        hung += live.tick(float(second))[1]
    assert hung == [(0, pytest.approx(6.9))]


def test_the_default_allows_a_long_pause_and_pings_several_times() -> None:
    live = Liveness()
    assert live.timeout == DEFAULT_TIMEOUT >= 10
    assert live.interval < live.timeout / 3
    with pytest.raises(ValueError, match="positive"):
        Liveness(0)


def test_notes_arrive_in_order_with_handoffs() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    x, y = socket.socketpair()
    with a, b, x, y:
        assert send_ping(a, 1)
        handoff.send_connection(a, x, b"link")
        assert send_ping(a, 2)
        got: list = []

        async def read() -> None:
            def note(state: bytes) -> None:
                got.append(("ping", ping_seq(state)))
                if len(got) == 3:
                    a.close()

            def conn(sock: socket.socket, state: bytes) -> None:
                got.append(("conn", state))
                sock.close()

            await asyncio.wait_for(handoff.receive_connections(b, conn, note), 30)

        asyncio.run(read())
        assert got == [("ping", 1), ("conn", b"link"), ("ping", 2)]


def test_a_note_on_a_channel_that_takes_none_breaks_it() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        send_ping(a, 1)
        with pytest.raises(handoff.HandoffError, match="note"):
            asyncio.run(
                asyncio.wait_for(handoff.receive_connections(b, lambda s, st: s.close()), 30)
            )


def test_a_ping_to_a_full_channel_is_dropped_not_waited_for() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        sent = 0
        while send_ping(a, sent + 1):
            sent += 1
        assert sent > 0
        reader = handoff.HandoffReader()
        seqs: list[int] = []
        b.setblocking(False)
        while True:
            try:
                data = b.recv(1 << 16)
            except BlockingIOError:
                break
            seqs += [ping_seq(state) for conn, state in reader.feed(data, []) if conn is None]
        assert seqs == list(range(1, sent + 1))  # whole frames only


@pytest.mark.parametrize("value", ["-1", "x", "nan", "inf"])
def test_a_bad_liveness_timeout_is_refused_naming_the_option(value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "leveret", "server", f"--worker-liveness-timeout={value}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "argument --worker-liveness-timeout" in proc.stderr


@pytest.mark.parametrize("value", ["-1", "nan", "inf", '"x"'])
def test_a_bad_liveness_timeout_in_the_config_file_is_refused(tmp_path, value: str) -> None:
    path = tmp_path / "leveret.toml"
    path.write_text(f"worker_liveness_timeout = {value}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "key 'worker_liveness_timeout'" in proc.stderr


# --- the supervisor with real processes: what it pings and kills --------------------


def supervise(
    child: str, *, answer: bool, ready: bool, timeout: float = 0.2
) -> tuple[Supervisor, list[int], int]:
    """Run one worker (`python -c child`) under a supervisor with a `timeout` liveness
    timeout until its first exit; `ready`: it is told the worker serves, `answer`:
    pings are answered (as a worker's loop does). The pings sent, and run()'s status."""
    pings: list[int] = []
    sup: Supervisor

    def ping(index: int, seq: int) -> None:
        pings.append(seq)
        if answer:
            sup.alive(index, seq)

    async def go() -> int:
        async def tell_ready() -> None:
            while sup.workers[0].state != "running":
                await asyncio.sleep(0.01)
            sup.ready(0)

        task = asyncio.create_task(tell_ready()) if ready else None
        rc = await asyncio.wait_for(sup.run(), 60)
        if task is not None:
            await task
        return rc

    sup = Supervisor(
        1,
        lambda i: [sys.executable, "-c", child],
        liveness_timeout=timeout,
        ping=ping,
        on_exit=lambda i, rc: sup.stop(),
    )
    rc = asyncio.run(go())
    return sup, pings, rc


def test_a_worker_not_ready_yet_is_neither_pinged_nor_killed() -> None:
    """A worker reading a large store back says nothing for many timeouts: it is
    left alone, and exits (here) by itself with its own status."""
    sup, pings, rc = supervise(
        "import time; time.sleep(2); raise SystemExit(3)", answer=False, ready=False
    )
    assert pings == []
    assert sup.workers[0].last_exit == 3 and sup.workers[0].hangs == 0


def test_a_ready_worker_that_answers_is_not_killed() -> None:
    sup, pings, rc = supervise(
        "import time; time.sleep(2); raise SystemExit(3)", answer=True, ready=True
    )
    assert pings  # it was watched
    assert sup.workers[0].last_exit == 3 and sup.workers[0].hangs == 0


def test_a_ready_worker_that_answers_nothing_is_killed() -> None:
    sup, pings, rc = supervise("import time; time.sleep(60)", answer=False, ready=True)
    assert pings
    assert sup.workers[0].last_exit == -signal.SIGKILL
    assert sup.workers[0].hangs == 1


def test_a_timeout_of_0_turns_the_check_off() -> None:
    sup, pings, rc = supervise(
        "import time; time.sleep(1); raise SystemExit(3)", answer=False, ready=True, timeout=0
    )
    assert sup.liveness is None and pings == []
    assert sup.workers[0].last_exit == 3 and sup.workers[0].hangs == 0
