"""Leveret: a RabbitMQ-compatible AMQP 0-9-1 message broker written in Python."""

__version__ = "0.1.0"
