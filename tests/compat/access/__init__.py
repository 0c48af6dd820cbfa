"""AMQP access control, recorded from RabbitMQ 3.10 and replayed against Leveret."""
