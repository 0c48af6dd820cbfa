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
QUORUM_ENV = "LEVERET_CELERY_QUORUM"  # "1": the task queue is a quorum queue


def make_app(broker_url: str, queue: str, quorum: bool = False) -> Celery:
    app = Celery("celery_app", broker=broker_url, backend="rpc://")
    if quorum:
        # Celery 5.5's quorum queues; with them, countdown and retries go through
        # kombu's native delayed delivery, which needs a topic (or fanout) exchange.
        app.conf.update(task_default_queue_type="quorum", task_default_exchange_type="topic")
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

    @app.task(name="celery_app.flaky", bind=True, max_retries=5, shared=False)
    def flaky(self, failures, countdown=1):
        """Fails `failures` times, retried after `countdown` s; returns its retries."""
        if self.request.retries < failures:
            raise self.retry(exc=RuntimeError("not yet"), countdown=countdown)
        return self.request.retries

    return app


app = make_app(
    os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1:5672/%2F"),
    os.environ.get(QUEUE_ENV, "celery"),
    quorum=os.environ.get(QUORUM_ENV) == "1",
)
