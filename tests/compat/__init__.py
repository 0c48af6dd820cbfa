"""The recorded differential suite: answers recorded from RabbitMQ 3.10, replayed on Leveret.

See tests/compat/README.md. Each area (http, access, prometheus, amqp, plugins) is a
subpackage with a `record` module (writes `recordings/`) and pytest tests that replay
the recordings against Leveret; shared helpers are in `common.py`.
"""
