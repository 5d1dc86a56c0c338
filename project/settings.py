"""Settings of the example project.

SQLite (in ``BASE_DIR / "db.sqlite3"``) by default; set ``DATABASE_URL`` (for example
``postgres://postgres@127.0.0.1:5432/test``) to use PostgreSQL.

From the environment: ``DJANGO_SECRET_KEY`` (else a key generated once into the git-ignored
``.secret_key``: fine on one machine, set the variable in any deployment), ``DJANGO_DEBUG=1``
(``DEBUG`` is off otherwise), ``DJANGO_ALLOWED_HOSTS`` (comma-separated, added to the local
names) and ``DJANGO_CONN_MAX_AGE`` (see :func:`conn_max_age`).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from durable_agent.conf import recommended_database, recommended_q_cluster

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY_FILE = BASE_DIR / ".secret_key"


def local_secret_key(path: Path = SECRET_KEY_FILE) -> str:
    """The key kept in ``path``, generated (mode 0600) by the first process that needs it.

    Every process of this checkout (the server, the cluster, test subprocesses) reads the same
    key, so sessions survive restarts; no key is ever committed.
    """
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(temporary, path)  # atomic, and never replaces a key another process wrote
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
        return _read_key(path)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"Set DJANGO_SECRET_KEY: no key could be generated in {path} ({exc})"
        ) from exc


def _read_key(path: Path) -> str:
    key = path.read_text(encoding="utf-8").strip()
    if len(key) < 50:
        raise ImproperlyConfigured(
            f"{path} holds no usable key; delete it or set DJANGO_SECRET_KEY"
        )
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or local_secret_key()
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "testserver",
    *(
        name.strip()
        for name in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",")
        if name.strip()
    ),
]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "durable_agent",
    # django-ninja's static files: the API docs' Swagger UI is served from here, not a CDN
    # (tests/extras runs the project without ninja, the optional "api" extra).
    *(["ninja"] if _importable("ninja") else []),
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


PERSISTENT_CONN_MAX_AGE = 600


def conn_max_age(
    argv: Sequence[str] = sys.argv,
    environ: Mapping[str, str] = os.environ,
    *,
    default: int = 0,
) -> int:
    """Seconds a PostgreSQL connection outlives the request or task that opened it.

    Persistent connections pay off only in processes that reuse their threads: django-q's
    pusher, monitor and workers call close_old_connections() around every task, which with 0
    means a new connection per dequeue and per task (the largest cost in bench/throughput).
    ``runserver`` serves every request on a new thread, so a kept connection is never reused
    and stays open until the server restarts (a burst of requests exhausts PostgreSQL's
    max_connections). So: ``DJANGO_CONN_MAX_AGE`` when set (a WSGI server whose worker threads
    are reused, see docs/deployment.md); else 600 for ``qcluster``, 0 for ``runserver``, and
    ``default`` for anything else.
    """
    value = environ.get("DJANGO_CONN_MAX_AGE", "").strip()
    if value:
        return int(value)
    command = argv[1] if len(argv) > 1 else ""
    if command == "qcluster":
        return PERSISTENT_CONN_MAX_AGE
    if command == "runserver":
        return 0
    return default


def _database() -> dict[str, Any]:
    # recommended_database(): connection health checks, and on SQLite BEGIN IMMEDIATE
    # (SQLite's stand-in for row locks) with a busy timeout; CONN_MAX_AGE per process, above.
    url = os.environ.get("DATABASE_URL")
    if url:
        return recommended_database(dj_database_url.parse(url), CONN_MAX_AGE=conn_max_age())
    return recommended_database(
        {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "TEST": {"NAME": os.environ.get("SQLITE_TEST_PATH") or None},
        },
        CONN_MAX_AGE=conn_max_age(),
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
    # The demo's deliberate failures (project.demo.agents.DemoFailure) log one line each.
    "filters": {"demo_failures": {"()": "project.demo.logging.OneLineDemoFailures"}},
    "formatters": {
        "q": {"format": "%(asctime)s [Q] %(levelname)s %(message)s", "datefmt": "%H:%M:%S"}
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "filters": ["demo_failures"]},
        "q_console": {
            "class": "logging.StreamHandler",
            "formatter": "q",
            "filters": ["demo_failures"],
        },
    },
    "loggers": {
        "durable_agent": {"handlers": ["console"], "level": os.environ.get("DA_LOG", "INFO")},
        # django-q2's own format, as it sets up when its logger has no handler.
        "django-q": {"handlers": ["q_console"], "level": "INFO", "propagate": False},
    },
}
