#!/usr/bin/env python3
"""Why basic.publish / basic.ack / basic.deliver are hand-coded: pamqp vs ours, per call.

    python bench/codec_bench.py [--n 200000]

Prints nanoseconds per operation for pamqp and for leveret.protocol.methods. The
hand-written codecs are checked against pamqp byte for byte in
tests/unit/test_protocol_codec.py.
"""

from __future__ import annotations

import argparse
import time

from pamqp import commands, frame

from leveret.protocol import methods as wire


def per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000)
    n = parser.parse_args().n
    publish = frame.marshal(commands.Basic.Publish(exchange="amq.direct", routing_key="bench"), 1)
    publish_payload = publish[7:-1]
    ack_payload = frame.marshal(commands.Basic.Ack(delivery_tag=12345, multiple=True), 1)[7:-1]
    prefix = wire.deliver_prefix("amq.ctag-bench")
    ex_rk = wire.short_strings("amq.direct", "bench")
    rows = [
        (
            "decode basic.publish",
            lambda: wire.decode_method(publish_payload),
            lambda: wire.decode_publish(publish_payload),
        ),
        (
            "decode basic.ack",
            lambda: wire.decode_method(ack_payload),
            lambda: wire.decode_ack(ack_payload),
        ),
        (
            "encode basic.deliver",
            lambda: frame.marshal(
                commands.Basic.Deliver("amq.ctag-bench", 99, False, "amq.direct", "bench"), 1
            ),
            lambda: wire.encode_deliver(1, prefix, 99, False, ex_rk),
        ),
    ]
    print(f"{'operation':24} {'pamqp ns':>10} {'leveret ns':>11} {'speed-up':>9}")
    for name, theirs, ours in rows:
        a, b = per_call(theirs, n), per_call(ours, n)
        print(f"{name:24} {a:10.0f} {b:11.0f} {a / b:8.1f}x")


if __name__ == "__main__":
    main()
