"""The Celery app of tests/cluster/test_clients_failover.py (the worker imports it).

One task, `record(i)`, appends `i` to the file named by LEVERET_CELERY_RECORD: what ran,
at least once. The broker URLs (every node of the cluster, `;`-separated: kombu's
failover list) come from LEVERET_CELERY_BROKER_URL.
"""

from __future__ import annotations

import os

from celery import Celery

BROKER_ENV = "LEVERET_CELERY_BROKER_URL"
RECORD_ENV = "LEVERET_CELERY_RECORD"
QUEUE = "failover-tasks"


def make_app(broker_url: str) -> Celery:
    app = Celery("celery_failover", broker=broker_url)
    app.conf.update(
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # publisher confirms: send_task returns once the broker holds the task
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # a failover is a few seconds: ride it out
        broker_heartbeat=0,
        task_publish_retry_policy={
            "max_retries": 30,
            "interval_start": 0.2,
            "interval_step": 0.2,
            "interval_max": 1.0,
        },
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=10,
    )

    @app.task(name="celery_failover.record", shared=False)
    def record(i: int) -> None:
        with open(os.environ[RECORD_ENV], "a") as f:
            f.write(f"{i}\n")

    return app


app = make_app(os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1:5672/%2F"))
