"""Settings of the example project.

SQLite (in ``BASE_DIR / "db.sqlite3"``) by default; set ``DATABASE_URL`` (for example
``postgres://postgres@127.0.0.1:5432/test``) to use PostgreSQL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

from durable_agent.conf import recommended_database, recommended_q_cluster

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
    # recommended_database(): persistent connections with health checks, and on SQLite
    # BEGIN IMMEDIATE (SQLite's stand-in for row locks) with a busy timeout.
    url = os.environ.get("DATABASE_URL")
    if url:
        return recommended_database(dj_database_url.parse(url))
    return recommended_database(
        {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH") or None},
        }
    )


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# The recommended django-q2 configuration (docs/settings.md): the ORM broker on the default
# alias, so enqueueing joins the caller's transaction, and AlarmBroker's fast path.
Q_CLUSTER = recommended_q_cluster(
    workers=int(os.environ.get("Q_WORKERS", "2")),
    # Q_BROKER_CLASS="" runs django-q's stock ORM broker (bench/ compares the two).
    broker_class=os.environ.get("Q_BROKER_CLASS", "durable_agent.broker.AlarmBroker") or None,
    label="Django Q2",
)

DURABLE_AGENT: dict[str, Any] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "durable_agent": {"handlers": ["console"], "level": os.environ.get("DA_LOG", "INFO")},
    },
}
