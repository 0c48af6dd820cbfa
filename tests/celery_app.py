"""A tiny Celery app for tests/test_celery.py.

The worker subprocess imports this module (``celery -A celery_app worker``) and reads
its broker URL and queue from the environment; the test process builds its own app
with :func:`make_app` so each test can point at its own broker.
"""

from __future__ import annotations

import os

from celery import Celery

BROKER_ENV = "LEVERET_CELERY_BROKER_URL"
QUEUE_ENV = "LEVERET_CELERY_QUEUE"


def make_app(broker_url: str, queue: str) -> Celery:
    app = Celery("celery_app", broker=broker_url, backend="rpc://")
    app.conf.update(
        task_default_queue=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=3,
        worker_hijack_root_logger=False,
        result_expires=300,
    )

    @app.task(name="celery_app.add", shared=False)
    def add(x, y):
        return x + y

    @app.task(name="celery_app.mul", shared=False)
    def mul(x, y):
        return x * y

    @app.task(name="celery_app.fail", shared=False)
    def fail(text):
        raise ValueError(text)

    return app


app = make_app(
    os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1:5672/%2F"),
    os.environ.get(QUEUE_ENV, "celery"),
)
