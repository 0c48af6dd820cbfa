"""Names are any UTF-8 up to 255 bytes, as in RabbitMQ: replies must echo them intact."""

from __future__ import annotations

import pika


def test_unusual_queue_and_exchange_names_round_trip(connection, names):
    ch = connection.channel()
    queue = names.queue("q with spaces/ü*!")
    exchange = names.exchange("ex with spaces ü")
    ok = ch.queue_declare(queue)
    assert ok.method.queue == queue
    ch.exchange_declare(exchange, "fanout")
    ch.queue_bind(queue, exchange)
    ch.basic_publish(exchange, "any key ✓", b"hi", pika.BasicProperties())
    method, _props, body = None, None, None
    for _ in range(50):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            break
        connection.process_data_events(time_limit=0.05)
    assert body == b"hi"
    assert method.exchange == exchange
    assert method.routing_key == "any key ✓"
    tag = ch.basic_consume(queue, lambda *a: None, consumer_tag="tag with spaces ü")
    assert tag == "tag with spaces ü"
    ch.basic_cancel(tag)


def test_mandatory_return_echoes_an_unusual_exchange_name(connection, names):
    ch = connection.channel()
    exchange = names.exchange("ret urn ü")
    ch.exchange_declare(exchange, "direct")
    returned = []
    ch.add_on_return_callback(lambda _ch, method, _p, _b: returned.append(method))
    ch.basic_publish(exchange, "nowhere ü", b"x", mandatory=True)
    connection.process_data_events(time_limit=0.3)
    assert returned and returned[0].exchange == exchange
