"""The six RabbitMQ tutorials (Python/pika), kept as close to the official code
as possible: https://www.rabbitmq.com/tutorials

Differences from the originals: the broker URL comes from ``amqp_url``,
exchange and queue names get a unique suffix (the reference broker is shared),
receivers run on threads and are stopped with ``add_callback_threadsafe``, the
workers do not sleep, and every wait has a timeout.
"""

from __future__ import annotations

import threading
import uuid

import pika
import pytest

from conftest import connection_params

WAIT = 10  # seconds; generous upper bound, tests finish as soon as messages arrive


class Receiver(threading.Thread):
    """Runs ``setup(channel, received)`` then ``channel.start_consuming()``.

    ``setup`` declares/binds/consumes exactly like a tutorial receiver and
    appends to ``received``.  ``ready`` is set once setup is done.
    """

    def __init__(self, url: str, setup, expected: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.setup = setup
        self.expected = expected
        self.received: list = []
        self.ready = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.connection = None
        self.channel = None

    def record(self, item) -> None:
        self.received.append(item)
        if len(self.received) >= self.expected:
            self.done.set()

    def run(self) -> None:
        try:
            self.connection = pika.BlockingConnection(connection_params(self.url))
            self.channel = self.connection.channel()
            self.setup(self.channel, self)
            self.ready.set()
            self.channel.start_consuming()
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self.ready.set()
            self.done.set()
        finally:
            if self.connection is not None and self.connection.is_open:
                try:
                    self.connection.close()
                except Exception:
                    pass

    def start_and_wait_ready(self) -> Receiver:
        self.start()
        assert self.ready.wait(WAIT), "receiver did not start"
        if self.error:
            raise self.error
        return self

    def wait_done(self) -> bool:
        return self.done.wait(WAIT)

    def stop(self) -> None:
        if self.connection is not None and self.connection.is_open and self.is_alive():
            try:
                self.connection.add_callback_threadsafe(self.channel.stop_consuming)
            except Exception:
                pass
        self.join(WAIT)
        if self.error:
            raise self.error


@pytest.fixture
def receivers():
    started: list[Receiver] = []

    def make(url, setup, expected):
        r = Receiver(url, setup, expected).start_and_wait_ready()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def test_tutorial_1_hello_world(amqp_url, names, receivers):
    hello = names.queue("hello")

    # receive.py
    def receive(channel, me):
        channel.queue_declare(queue=hello)

        def callback(ch, method, properties, body):
            me.record(body)

        channel.basic_consume(queue=hello, on_message_callback=callback, auto_ack=True)

    receiver = receivers(amqp_url, receive, expected=1)

    # send.py
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.queue_declare(queue=hello)
    channel.basic_publish(exchange="", routing_key=hello, body="Hello World!")
    connection.close()

    assert receiver.wait_done()
    assert receiver.received == [b"Hello World!"]


def test_tutorial_2_work_queues(amqp_url, names, receivers):
    task_queue = names.queue("task_queue")

    # worker.py (twice)
    def worker(channel, me):
        channel.queue_declare(queue=task_queue, durable=True)

        def callback(ch, method, properties, body):
            me.record(body.decode())  # the original sleeps body.count(b".") seconds
            ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(queue=task_queue, on_message_callback=callback)

    tasks = [f"Task {i}" + "." * (i % 4) for i in range(10)]
    worker1 = receivers(amqp_url, worker, expected=len(tasks))
    worker2 = receivers(amqp_url, worker, expected=len(tasks))

    # new_task.py
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.queue_declare(queue=task_queue, durable=True)
    for message in tasks:
        channel.basic_publish(
            exchange="",
            routing_key=task_queue,
            body=message,
            properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
        )
    connection.close()

    def all_done():
        return len(worker1.received) + len(worker2.received) >= len(tasks)

    for _ in range(WAIT * 20):
        if all_done():
            break
        worker1.done.wait(0.05)
    assert sorted(worker1.received + worker2.received) == sorted(tasks)


def test_tutorial_3_publish_subscribe(amqp_url, names, receivers):
    logs = names.exchange("logs")

    # receive_logs.py (twice)
    def receive_logs(channel, me):
        channel.exchange_declare(exchange=logs, exchange_type="fanout")
        result = channel.queue_declare(queue="", exclusive=True)
        queue_name = result.method.queue
        channel.queue_bind(exchange=logs, queue=queue_name)

        def callback(ch, method, properties, body):
            me.record(body)

        channel.basic_consume(queue=queue_name, on_message_callback=callback, auto_ack=True)

    r1 = receivers(amqp_url, receive_logs, expected=3)
    r2 = receivers(amqp_url, receive_logs, expected=3)

    # emit_log.py
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.exchange_declare(exchange=logs, exchange_type="fanout")
    for message in ["info: Hello World!", "warning: one", "error: two"]:
        channel.basic_publish(exchange=logs, routing_key="", body=message)
    connection.close()

    assert r1.wait_done() and r2.wait_done()
    expected = [b"info: Hello World!", b"warning: one", b"error: two"]
    assert r1.received == expected
    assert r2.received == expected


def test_tutorial_4_routing(amqp_url, names, receivers):
    direct_logs = names.exchange("direct_logs")

    def receive_logs_direct(severities):
        def setup(channel, me):
            channel.exchange_declare(exchange=direct_logs, exchange_type="direct")
            result = channel.queue_declare(queue="", exclusive=True)
            queue_name = result.method.queue
            for severity in severities:
                channel.queue_bind(exchange=direct_logs, queue=queue_name, routing_key=severity)

            def callback(ch, method, properties, body):
                me.record((method.routing_key, body))

            channel.basic_consume(queue=queue_name, on_message_callback=callback, auto_ack=True)

        return setup

    errors = receivers(amqp_url, receive_logs_direct(["error"]), expected=2)
    everything = receivers(amqp_url, receive_logs_direct(["info", "warning", "error"]), expected=4)

    # emit_log_direct.py
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.exchange_declare(exchange=direct_logs, exchange_type="direct")
    sent = [("info", "i1"), ("error", "e1"), ("warning", "w1"), ("debug", "d1"), ("error", "e2")]
    for severity, message in sent:
        channel.basic_publish(exchange=direct_logs, routing_key=severity, body=message)
    connection.close()

    assert errors.wait_done() and everything.wait_done()
    assert errors.received == [("error", b"e1"), ("error", b"e2")]
    assert everything.received == [
        ("info", b"i1"),
        ("error", b"e1"),
        ("warning", b"w1"),
        ("error", b"e2"),
    ]


def test_tutorial_5_topics(amqp_url, names, receivers):
    topic_logs = names.exchange("topic_logs")

    def receive_logs_topic(binding_keys):
        def setup(channel, me):
            channel.exchange_declare(exchange=topic_logs, exchange_type="topic")
            result = channel.queue_declare("", exclusive=True)
            queue_name = result.method.queue
            for binding_key in binding_keys:
                channel.queue_bind(exchange=topic_logs, queue=queue_name, routing_key=binding_key)

            def callback(ch, method, properties, body):
                me.record(method.routing_key)

            channel.basic_consume(queue=queue_name, on_message_callback=callback, auto_ack=True)

        return setup

    keys = ["kern.critical", "kern.info", "cron.critical", "cron.info", "kern.disk.critical"]
    all_logs = receivers(amqp_url, receive_logs_topic(["#"]), expected=5)
    kern = receivers(amqp_url, receive_logs_topic(["kern.*"]), expected=2)
    critical = receivers(amqp_url, receive_logs_topic(["*.critical"]), expected=2)
    both = receivers(amqp_url, receive_logs_topic(["kern.*", "*.critical"]), expected=3)

    # emit_log_topic.py
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.exchange_declare(exchange=topic_logs, exchange_type="topic")
    for routing_key in keys:
        channel.basic_publish(exchange=topic_logs, routing_key=routing_key, body="A message")
    connection.close()

    for r in (all_logs, kern, critical, both):
        assert r.wait_done()
    assert all_logs.received == keys
    assert kern.received == ["kern.critical", "kern.info"]
    assert critical.received == ["kern.critical", "cron.critical"]
    assert both.received == ["kern.critical", "kern.info", "cron.critical"]


def fib(n):
    if n == 0:
        return 0
    elif n == 1:
        return 1
    else:
        return fib(n - 1) + fib(n - 2)


class FibonacciRpcClient:
    def __init__(self, url, rpc_queue):
        self.rpc_queue = rpc_queue
        self.connection = pika.BlockingConnection(pika.URLParameters(url))

        self.channel = self.connection.channel()

        result = self.channel.queue_declare(queue="", exclusive=True)
        self.callback_queue = result.method.queue

        self.channel.basic_consume(
            queue=self.callback_queue, on_message_callback=self.on_response, auto_ack=True
        )

        self.response = None
        self.corr_id = None

    def on_response(self, ch, method, props, body):
        if self.corr_id == props.correlation_id:
            self.response = body

    def call(self, n):
        self.response = None
        self.corr_id = str(uuid.uuid4())
        self.channel.basic_publish(
            exchange="",
            routing_key=self.rpc_queue,
            properties=pika.BasicProperties(
                reply_to=self.callback_queue,
                correlation_id=self.corr_id,
            ),
            body=str(n),
        )
        for _ in range(WAIT * 20):  # the original: process_data_events(time_limit=None)
            if self.response is not None:
                break
            self.connection.process_data_events(time_limit=0.05)
        return int(self.response)


def test_tutorial_6_rpc(amqp_url, names, receivers):
    rpc_queue = names.queue("rpc_queue")

    # rpc_server.py
    def rpc_server(channel, me):
        channel.queue_declare(queue=rpc_queue)

        def on_request(ch, method, props, body):
            n = int(body)
            response = fib(n)
            me.record(n)
            ch.basic_publish(
                exchange="",
                routing_key=props.reply_to,
                properties=pika.BasicProperties(correlation_id=props.correlation_id),
                body=str(response),
            )
            ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(queue=rpc_queue, on_message_callback=on_request)

    server = receivers(amqp_url, rpc_server, expected=3)

    fibonacci_rpc = FibonacciRpcClient(amqp_url, rpc_queue)
    try:
        assert fibonacci_rpc.call(30 // 3) == 55
        assert fibonacci_rpc.call(1) == 1
        assert fibonacci_rpc.call(15) == 610
    finally:
        fibonacci_rpc.connection.close()
    assert server.received == [10, 1, 15]


def test_tutorial_6_rpc_direct_reply_to(amqp_url, names, receivers):
    """Same RPC server, client using the amq.rabbitmq.reply-to pseudo queue
    (advertised through the direct_reply_to capability)."""
    rpc_queue = names.queue("rpc_queue")

    def rpc_server(channel, me):
        channel.queue_declare(queue=rpc_queue)

        def on_request(ch, method, props, body):
            me.record(props.reply_to)
            ch.basic_publish(
                exchange="",
                routing_key=props.reply_to,
                properties=pika.BasicProperties(correlation_id=props.correlation_id),
                body=str(fib(int(body))),
            )
            ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_consume(queue=rpc_queue, on_message_callback=on_request)

    server = receivers(amqp_url, rpc_server, expected=1)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        replies = []
        channel.basic_consume(
            "amq.rabbitmq.reply-to",
            lambda ch, m, p, b: replies.append((p.correlation_id, b)),
            auto_ack=True,
        )
        channel.basic_publish(
            "",
            rpc_queue,
            "12",
            pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c12"),
        )
        for _ in range(WAIT * 20):
            if replies:
                break
            connection.process_data_events(time_limit=0.05)
        assert replies == [("c12", b"144")]
        assert server.received[0].startswith("amq.rabbitmq.reply-to.")
    finally:
        connection.close()
