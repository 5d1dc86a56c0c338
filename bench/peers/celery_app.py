"""The Celery app of ``python -m bench.peers``: Redis broker, Django's settings and ORM.

    celery -A bench.peers.celery_app worker --pool prefork --concurrency 2

Celery's defaults but three: results are not stored (the task writes its own row), Celery
leaves the root logger alone (so bench/faults.py's handler records every ERROR in the worker),
and the broker is the Redis database named by ``BENCH_REDIS_URL`` (default
``redis://127.0.0.1:6379/7``) with the queue ``h_peers``.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peers.settings")

import django

django.setup()

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402

QUEUE = "h_peers"

app = Celery("bench_peers", broker=settings.BENCH_REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    enable_utc=True,
    timezone="UTC",
)


@app.task(name="bench.peers.record")
def celery_record(system: str, key: str) -> None:
    from bench.peers.tasks import record

    record(system, key)
