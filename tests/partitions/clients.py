"""The clients of a partition run: publishers and consumers that record everything.

Each runs as its own process (`python -m tests.partitions.clients ...`) inside a
client host's namespace, and writes one JSON line per event to its record file,
line-buffered so that a record exists before the act it records (a publisher writes
"sent" before it publishes: whatever a consumer gets was recorded as sent first):

- publisher: {"e": "sent", "seq": n, "t": ...} then {"e": "ok" | "nack" | "unknown",
  "seq": n, "t": ...}. Confirms are on and each publish waits for its own (pika's
  blocking channel), so "ok" is a confirm for exactly that message; a lost
  connection makes the message "unknown" and the publisher goes on with the next
  seq on a new connection (it does not publish the same message again).
- consumer of a queue: {"e": "got", "id": "p0:17", "r": redelivered, "t": ...},
  acknowledged after the line is written.
- consumer of a stream: {"e": "got", "id": ..., "off": offset, "t": ...}; after a
  reconnection it asks for the offset after the last one it got.

A client goes through the node addresses it was given in turn (any node serves:
a follower passes the connection on to the leader), with pika heartbeats of 2 s so
that a silent link is found. SIGTERM ends it cleanly.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

import pika
import pika.exceptions

STOP = False


def _stop(*_: Any) -> None:
    global STOP
    STOP = True


def params(urls: list[str]) -> list[pika.URLParameters]:
    out = []
    for url in urls:
        p = pika.URLParameters(url)
        p.heartbeat = 2
        p.blocked_connection_timeout = 10
        p.socket_timeout = 3
        p.stack_timeout = 6
        p.connection_attempts = 1
        out.append(p)
    return out


class Recorder:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered for the run)

    def __call__(self, **event: Any) -> None:
        event["t"] = round(time.time(), 3)
        self.f.write(json.dumps(event, separators=(",", ":")) + "\n")


def connect(urls: list[str], turn: int, rec: Recorder) -> pika.BlockingConnection | None:
    ps = params(urls)
    p = ps[turn % len(ps)]
    try:
        conn = pika.BlockingConnection(p)
    except Exception as exc:  # noqa: BLE001 (any failure: try the next address)
        rec(e="connect_failed", host=p.host, why=exc.__class__.__name__)
        time.sleep(0.3)
        return None
    rec(e="connected", host=p.host)
    return conn


def declare(ch: Any, queue: str, kind: str) -> None:
    args = {"x-queue-type": kind} if kind in ("quorum", "stream") else {}
    ch.queue_declare(queue, durable=True, arguments=args)


def publisher(args: argparse.Namespace) -> None:
    rec = Recorder(args.out)
    seq, turn = 0, 0
    while not STOP:
        conn = connect(args.urls, turn, rec)
        turn += 1
        if conn is None:
            continue
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            declare(ch, args.queue, args.kind)
            while not STOP:
                seq += 1
                msg_id = f"{args.name}:{seq}"
                rec(e="sent", seq=seq)
                try:
                    ch.basic_publish(
                        "",
                        args.queue,
                        msg_id.encode(),
                        pika.BasicProperties(delivery_mode=2, message_id=msg_id),
                    )
                except pika.exceptions.NackError:
                    rec(e="nack", seq=seq)
                    continue
                except Exception:
                    rec(e="unknown", seq=seq)
                    raise
                rec(e="ok", seq=seq)
                if args.interval:
                    time.sleep(args.interval)
        except Exception as exc:  # noqa: BLE001 (a lost connection: connect again)
            rec(e="lost", why=f"{exc.__class__.__name__}: {exc}"[:200])
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110
                pass


def consumer(args: argparse.Namespace) -> None:
    rec = Recorder(args.out)
    turn = 0
    next_offset: int | None = 0 if args.kind == "stream" else None
    while not STOP:
        conn = connect(args.urls, turn, rec)
        turn += 1
        if conn is None:
            continue
        try:
            ch = conn.channel()
            declare(ch, args.queue, args.kind)
            ch.basic_qos(prefetch_count=100)
            cargs = {"x-stream-offset": next_offset} if args.kind == "stream" else None
            for method, props, body in ch.consume(
                args.queue, auto_ack=False, arguments=cargs, inactivity_timeout=0.5
            ):
                if STOP:
                    break
                if method is None:
                    continue
                event: dict[str, Any] = {"e": "got", "id": body.decode(errors="replace")}
                if args.kind == "stream":
                    off = (props.headers or {}).get("x-stream-offset")
                    event["off"] = off
                    if isinstance(off, int):
                        next_offset = off + 1
                else:
                    event["r"] = bool(method.redelivered)
                rec(**event)
                ch.basic_ack(method.delivery_tag)
        except Exception as exc:  # noqa: BLE001 (a lost connection: connect again)
            rec(e="lost", why=f"{exc.__class__.__name__}: {exc}"[:200])
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110
                pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["publisher", "consumer"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--kind", choices=["classic", "quorum", "stream"], default="classic")
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.0, help="pause between publishes")
    ap.add_argument("urls", nargs="+")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    (publisher if args.role == "publisher" else consumer)(args)
    sys.exit(0)


if __name__ == "__main__":
    main()
