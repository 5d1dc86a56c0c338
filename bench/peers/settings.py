"""Settings for ``python -m bench.peers``: the benchmark settings plus the peers under test.

durable_agent and django-q2 keep the example settings of ``bench/settings.py`` (AlarmBroker
unless ``Q_BROKER_CLASS=""``, ``bulk`` 4, ``poll`` 0.05, persistent connections with health
checks); every peer uses the same database and the same connection settings.
"""

import os

from bench.settings import *  # noqa: F403
from bench.settings import INSTALLED_APPS

# procrastinate's Django app comes before the app that registers its task (its docs ask so).
INSTALLED_APPS = [
    *INSTALLED_APPS,
    "procrastinate.contrib.django",
    "django_tasks",
    "django_tasks_db",
    "bench.peers",
]

# django-tasks with its database backend (django-tasks-db's README); the worker's poll interval
# is a db_worker argument (bench/peers/systems.py).
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}

# procrastinate: tasks are found in each app's tasks.py (its default); the worker's options are
# command-line arguments (bench/peers/systems.py).
PROCRASTINATE_AUTODISCOVER_MODULE_NAME = "tasks"

# Celery (bench/peers/celery_app.py reads these).
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
