"""Prometheus families, types and label names, recorded from RabbitMQ 3.10 and replayed
against Leveret."""
