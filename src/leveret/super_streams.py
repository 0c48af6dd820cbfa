"""Create and delete super streams in one step, over AMQP, on any broker.

A super stream is what RabbitMQ's `rabbitmq-streams add_super_stream` creates: a
durable direct exchange NAME and durable streams NAME-0 .. NAME-(N-1), each bound
with routing key `i` and the binding argument `x-stream-partition-order: i`.
Leveret adds, on request, an `x-consistent-hash` exchange NAME-hash bound to
every partition with weight 1, so a plain AMQP publisher need not pick the
partition: messages with the same routing key reach the same partition.
"""

from __future__ import annotations

from leveret.client.blocking import connect

STREAM = {"x-queue-type": "stream"}


def partition_names(name: str, partitions: int) -> list[str]:
    return [f"{name}-{i}" for i in range(partitions)]


def create_super_stream(
    url: str,
    name: str,
    partitions: int,
    hash_exchange: bool = False,
    stream_arguments: dict | None = None,
) -> list[str]:
    """Declare the exchange(s), the partitions and their bindings; returns the partitions."""
    if partitions < 1:
        raise ValueError(f"a super stream needs at least 1 partition, got {partitions}")
    names = partition_names(name, partitions)
    with connect(url, recovery=False) as conn:
        ch = conn.channel()
        ch.declare_exchange(name, "direct", durable=True)
        if hash_exchange:
            ch.declare_exchange(f"{name}-hash", "x-consistent-hash", durable=True)
        for i, stream in enumerate(names):
            ch.declare_queue(stream, durable=True, arguments={**STREAM, **(stream_arguments or {})})
            ch.bind_queue(stream, name, str(i), arguments={"x-stream-partition-order": i})
            if hash_exchange:
                ch.bind_queue(stream, f"{name}-hash", "1")
    return names


def delete_super_stream(url: str, name: str, partitions: int) -> None:
    """Delete the partitions and the exchange(s); missing ones are not an error."""
    with connect(url, recovery=False) as conn:
        ch = conn.channel()
        for stream in partition_names(name, partitions):
            ch.delete_queue(stream)
        ch.delete_exchange(name)
        ch.delete_exchange(f"{name}-hash")
