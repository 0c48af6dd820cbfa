"""The model through its ports (broker.ports), without a server: a queue delivers to
any DeliveryChannel, resumes any Publisher, and a connection's publisher pauses
(server.publisher_pause) end only when every reason has.

The AMQP behaviour over sockets is tested elsewhere (test_basic, test_alarms,
test_ext_limits); these pin the seams the hot path goes through.
"""

from __future__ import annotations

from pamqp import commands

from leveret.broker.consumer import Consumer
from leveret.broker.message import Message
from leveret.broker.vhost import VirtualHost
from leveret.protocol.properties import encode_header
from leveret.server.publisher_pause import PublisherPause


class Channel:
    """A DeliveryChannel that keeps what it is given."""

    def __init__(self) -> None:
        self.deliverable = True
        self.global_prefetch = 0
        self.unacked_count = 0
        self.delivered: list[bytes] = []

    def deliver(self, consumer, queue, entry) -> None:
        self.delivered.append(entry.message.body)
        consumer.unacked += 1
        self.unacked_count += 1


class Publisher:
    def __init__(self) -> None:
        self.resumed: list[str] = []

    def resume_after_flow(self, queue) -> None:
        self.resumed.append(queue.name)


def _message(body: bytes) -> Message:
    header = encode_header(len(body), commands.Basic.Properties())
    return Message("", "q", header, body, 0, False)


def test_a_queue_delivers_to_any_delivery_channel_within_its_prefetch():
    vhost = VirtualHost("/")
    queue = vhost.declare_queue("q")
    channel = Channel()
    consumer = Consumer("c1", channel, queue, no_ack=False, exclusive=False, prefetch=2)
    queue.add_consumer(consumer)
    for i in range(3):
        queue.enqueue(_message(b"m%d" % i))
    queue.dispatch()
    assert channel.delivered == [b"m0", b"m1"]  # the third waits for an ack
    assert queue.message_count == 1 and queue.unacked == 2


def test_a_queue_resumes_the_publishers_it_holds_back():
    vhost = VirtualHost("/")
    queue = vhost.declare_queue("q")
    first, second = Publisher(), Publisher()
    queue.throttle(first)
    queue.throttle(second)
    queue.release_publishers()
    assert (first.resumed, second.resumed) == (["q"], ["q"])
    queue.release_publishers()  # nobody left to resume
    assert first.resumed == ["q"]


def test_reading_resumes_only_when_every_reason_has_ended():
    calls: list[str] = []
    pause = PublisherPause(lambda: calls.append("pause"), lambda: calls.append("resume"))
    pause.start_flow("q1")
    pause.start_flow("q2")
    pause.start_alarm()
    pause.start_disk()
    assert calls == ["pause"] and pause.reasons == ["flow", "alarm", "disk"]
    pause.end_flow("q1")
    pause.end_alarm()
    pause.end_disk()
    assert calls == ["pause"] and pause.reasons == ["flow"]
    pause.end_flow("q2")
    assert calls == ["pause", "resume"] and pause.reasons == []
    pause.end_alarm()  # an end without a start changes nothing
    assert calls == ["pause", "resume"]


def test_a_closed_connection_is_never_resumed_and_hands_back_its_queues():
    calls: list[str] = []
    pause = PublisherPause(lambda: calls.append("pause"), lambda: calls.append("resume"))
    pause.start_flow("q1")
    assert pause.close() == {"q1"}
    pause.end_flow("q1")
    pause.start_disk()
    pause.end_disk()
    assert calls == ["pause"]
