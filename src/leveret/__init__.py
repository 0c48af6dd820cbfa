"""Leveret: a RabbitMQ-compatible AMQP 0-9-1 message broker written in Python."""

from leveret import _build

__version__ = "0.1.0"

# Before any hot-path module is imported: LEVERET_PURE_PYTHON=1, or a compiled module
# whose source has changed since, makes its `.py` run (leveret/_build.py).
_build.install()
build_info = _build.build_info
