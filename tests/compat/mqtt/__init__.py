"""MQTT 3.1.1 as RabbitMQ 3.10's MQTT plugin answers it, recorded and replayed."""
