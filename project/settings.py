"""Settings of the example project.

SQLite (in ``BASE_DIR / "db.sqlite3"``) by default; set ``DATABASE_URL`` (for example
``postgres://postgres@127.0.0.1:5432/test``) to use PostgreSQL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "durable-agent-example-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "durable_agent",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"


def _database() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL")
    if url:
        # Persistent connections: django-q's pusher, monitor and workers call
        # close_old_connections() around every task, which with CONN_MAX_AGE=0 means a new
        # PostgreSQL connection per dequeue and per task (the largest cost in bench/throughput).
        return dict(dj_database_url.parse(url, conn_max_age=600, conn_health_checks=True))
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        # BEGIN IMMEDIATE serialises writers: SQLite's stand-in for row locks.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH") or None},
    }


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# django-q2 with the ORM broker on the default alias, so enqueueing joins the caller's
# transaction. ``timeout`` must stay below ``retry`` (django-q2 warns otherwise).
Q_CLUSTER = {
    "name": "durable_agent",
    "orm": "default",
    "workers": int(os.environ.get("Q_WORKERS", "2")),
    "queue_limit": 4,
    "timeout": 60 * 15,
    "retry": 60 * 16,
    "poll": 0.05,
    # The pusher claims up to 4 queued tasks per query (docs/deployment.md).
    "bulk": 4,
    # The fast path: fire due alarm slots within ~0.1 s instead of django-q's ~30 s scan.
    "broker_class": os.environ.get("Q_BROKER_CLASS", "durable_agent.broker.AlarmBroker"),
    "catch_up": False,
    "ack_failures": True,
    # PassRecord is the pass history; keeping django-q's Success rows as well costs the
    # monitor a locked scan of up to 250 rows per task (see docs/deployment.md).
    "save_limit": -1,
    "max_attempts": 0,
    "label": "Django Q2",
}

DURABLE_AGENT: dict[str, Any] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "durable_agent": {"handlers": ["console"], "level": os.environ.get("DA_LOG", "INFO")},
    },
}
