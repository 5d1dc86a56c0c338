"""The systems ``python -m bench.peers`` compares, each with its workers and its way to arm a timer.

Every system runs its recommended settings (docs/benchmarks.md, "Side by side with the
peers", cites them) with two workers, on the same PostgreSQL database and the same Django
settings (``bench/peers/settings.py``); every task runs ``bench.peers.tasks.record``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import ROOT

RECORD = "bench.peers.tasks.record"


class System:
    """One column of the table: how to start its workers, arm a timer, and count its failures."""

    name = ""  # the column, and the --only name
    system = ""  # Run.system: at most 16 characters
    label = ""
    arm_cost = 0.01  # seconds per armed timer, updated from each arming (the arming lead)

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""
        return None

    def commands(self) -> list[list[str]]:
        """The worker processes' command lines (run from the repository root)."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return {}

    def arm(self, key: str, deadline: datetime) -> None:
        """Arm timer ``key`` for ``deadline``: one producer call in its own commit."""
        raise NotImplementedError

    def wake_up_in(self, key: str, deadline: datetime) -> None:
        """Inside an open ``transaction.atomic``: schedule a wake-up for ``deadline``."""
        raise NotImplementedError

    def enqueue_now(self, key: str, variant: str) -> None:
        """Enqueue the task of timer ``key`` to run now, in its own committed transaction (the
        immediate scenario); ``variant`` is ``task``, or durable_agent's ``lane``/``submit``."""
        raise NotImplementedError

    def clean(self) -> None:
        """Delete the system's own queue rows (no worker of it is running)."""

    def failures(self) -> int:
        """Tasks the system itself reports as failed since the last ``clean``."""
        return 0

    def drained(self) -> bool:
        """Nothing of this system is left to run soon (checked before its workers stop)."""
        return True

    # Processes ---------------------------------------------------------------------------

    def start(self, errors: str, log: Path) -> list[subprocess.Popen[bytes]]:
        from django.db import connections

        connections.close_all()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.peers.settings",
            "BENCH_ERROR_DIR": errors,
            "SOAK_SOURCE": self.name,
            **self.environment(),
        }
        out = open(log, "ab")  # noqa: SIM115  (each child keeps its own descriptor)
        try:
            return [
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: a hung stop is killed whole
                )
                for argv in self.commands()
            ]
        finally:
            out.close()

    @staticmethod
    def stop(processes: Sequence[subprocess.Popen[bytes]], timeout: float = 60) -> list[str]:
        """SIGTERM to each main process; what went wrong (a kill, an early exit)."""
        problems = []
        for process in processes:
            if process.poll() is not None:
                problems.append(f"pid {process.pid} exited early with {process.returncode}")
            else:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                problems.append(f"pid {process.pid} did not stop in {timeout:g} s: killed")
        return problems


def _manage(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args]


class DurableAgent(System):
    """durable_agent: a host lane per timer, scheduled with ``gate.schedule``; AlarmBroker."""

    name = "durable_agent"
    system = "da"
    label = "durable_agent (AlarmBroker + gate)"
    arm_cost = 0.02

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}

    def prepare(self, keys: Sequence[str]) -> None:
        """Create the hosts and run each one's first-use pass: caught up, nothing pending."""
        from durable_agent.maintenance import run_pass
        from durable_agent.models import Host

        missing = [key for key in keys if key not in self.hosts]
        for host in Host.objects.bulk_create([Host(key=key) for key in missing]):
            run_pass(host)
            self.hosts[host.key] = host.pk

    def commands(self) -> list[list[str]]:
        return [_manage("qcluster")]

    def environment(self) -> dict[str, str]:
        return {"Q_WORKERS": "2", "Q_BROKER_CLASS": "durable_agent.broker.AlarmBroker"}

    def arm(self, key: str, deadline: datetime) -> None:
        from bench.peers.tasks import LANE
        from durable_agent.maintenance import gate

        gate.schedule(self.hosts[key], LANE, deadline)

    def wake_up_in(self, key: str, deadline: datetime) -> None:  # pragma: no cover
        raise AssertionError("durable_agent's commit scenario uses gate.transaction")

    def enqueue_now(self, key: str, variant: str) -> None:
        """``gate.schedule(host, lane, now)`` (its own alarm transaction), or ``submit()`` of the
        trivial agent ``peers-record`` (bench/peers/tasks.py) to the timer's host."""
        from django.utils import timezone

        import durable_agent
        from bench.peers.tasks import AGENT, LANE
        from durable_agent.maintenance import gate

        if variant == "submit":
            durable_agent.submit(
                host=self.hosts[key], thread="t", agent=AGENT, payload={"key": key}
            )
        else:
            gate.schedule(self.hosts[key], LANE, timezone.now())

    def failures(self) -> int:
        from django_q.models import Task

        return Task.objects.filter(success=False).count()

    def drained(self) -> bool:
        """No alarm delivery queued and no lane due within a minute (the commit scenario's
        wake-ups are half an hour ahead): a later system's cluster must not run our passes."""
        from datetime import timedelta

        from django.utils import timezone
        from django_q.models import OrmQ

        from durable_agent.models import DueLane

        soon = timezone.now() + timedelta(minutes=1)
        return not OrmQ.objects.exists() and not DueLane.objects.filter(due_at__lte=soon).exists()


class DjangoQ(System):
    """django-q2: one ONCE ``Schedule`` row per timer, fired by AlarmBroker or by the stock
    scheduler alone."""

    def __init__(self, *, fast: bool) -> None:
        self.fast = fast
        self.name = "dq-alarm" if fast else "dq-stock"
        self.system = self.name
        self.label = (
            "django-q2 Schedule + AlarmBroker" if fast else "django-q2 stock (Schedule, ORM)"
        )

    def commands(self) -> list[list[str]]:
        return [_manage("qcluster")]

    def environment(self) -> dict[str, str]:
        broker = "durable_agent.broker.AlarmBroker" if self.fast else ""
        return {"Q_WORKERS": "2", "Q_BROKER_CLASS": broker}

    def arm(self, key: str, deadline: datetime) -> None:
        self.wake_up_in(key, deadline)

    def wake_up_in(self, key: str, deadline: datetime) -> None:
        from django_q.models import Schedule

        Schedule.objects.create(
            func=RECORD,
            args=repr((self.system, key)),
            schedule_type=Schedule.ONCE,
            repeats=1,
            next_run=deadline,
        )

    def enqueue_now(self, key: str, variant: str) -> None:
        """``async_task`` (django-q2's ORM broker row, in the caller's transaction)."""
        from django.db import transaction
        from django_q.tasks import async_task

        with transaction.atomic():
            async_task(RECORD, self.system, key)

    def clean(self) -> None:
        from django_q.models import OrmQ, Schedule, Task

        Schedule.objects.filter(func=RECORD).delete()
        OrmQ.objects.all().delete()
        Task.objects.filter(func=RECORD).delete()

    def failures(self) -> int:
        from django_q.models import Task

        return Task.objects.filter(func=RECORD, success=False).count()


class Procrastinate(System):
    """procrastinate through its Django app: ``defer`` on Django's connection (so it joins the
    caller's transaction), a worker with LISTEN/NOTIFY, concurrency 2, polling every 0.1 s."""

    name = "procrastinate"
    system = "procrastinate"
    label = "procrastinate 3.10"

    def commands(self) -> list[list[str]]:
        return [
            _manage(
                "procrastinate",
                "worker",
                "--concurrency",
                "2",
                "--fetch-job-polling-interval",
                "0.1",
                "--listen-notify",
            )
        ]

    def arm(self, key: str, deadline: datetime) -> None:
        self.wake_up_in(key, deadline)

    def wake_up_in(self, key: str, deadline: datetime) -> None:
        from bench.peers.tasks import procrastinate_record

        procrastinate_record.configure(schedule_at=deadline).defer(system=self.system, key=key)

    def enqueue_now(self, key: str, variant: str) -> None:
        """``defer`` with no schedule (its job row and NOTIFY, in the caller's transaction)."""
        from django.db import transaction

        from bench.peers.tasks import procrastinate_record

        with transaction.atomic():
            procrastinate_record.defer(system=self.system, key=key)

    def clean(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE procrastinate_jobs CASCADE")

    def failures(self) -> int:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'")
            return int(cursor.fetchone()[0])


class Celery(System):
    """Celery with Redis: ``apply_async(eta=...)``; one prefork worker, concurrency 2."""

    name = "celery"
    system = "celery"
    label = "Celery 5.7 + Redis"

    def url(self) -> str:
        from django.conf import settings

        return str(settings.BENCH_REDIS_URL)

    def unavailable(self) -> str | None:
        import redis

        try:
            redis.Redis.from_url(self.url(), socket_connect_timeout=1, socket_timeout=1).ping()
        except Exception as exc:  # any failure means: no Redis to run Celery on
            return f"no Redis answers at {self.url()} ({type(exc).__name__}: {exc})"
        return None

    def commands(self) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.peers.celery_app",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--queues",
                "h_peers",
                "--hostname",
                "h_peers@%h",
                "--loglevel",
                "WARNING",
            ]
        ]

    def arm(self, key: str, deadline: datetime) -> None:
        from bench.peers.celery_app import celery_record

        celery_record.apply_async((self.system, key), eta=deadline)

    def wake_up_in(self, key: str, deadline: datetime) -> None:
        from django.db import transaction

        from bench.peers.celery_app import celery_record

        transaction.on_commit(lambda: celery_record.apply_async((self.system, key), eta=deadline))

    def enqueue_now(self, key: str, variant: str) -> None:
        """``apply_async`` with no ETA, sent when the caller's transaction commits."""
        from django.db import transaction

        from bench.peers.celery_app import celery_record

        with transaction.atomic():
            transaction.on_commit(lambda: celery_record.apply_async((self.system, key)))

    def clean(self) -> None:
        """Empty the queue and the unacknowledged messages (the ETA tasks) of our Redis db."""
        import redis

        client = redis.Redis.from_url(self.url())
        keys = ["h_peers", "unacked", "unacked_index", "unacked_mutex"]
        keys += [k.decode() for k in client.scan_iter("_kombu.binding.*")]
        client.delete(*keys)


class DjangoTasks(System):
    """django-tasks with django-tasks-db: ``enqueue`` writes a row in the caller's transaction;
    two ``db_worker`` processes polling every 0.1 s."""

    name = "django-tasks"
    system = "django-tasks"
    label = "django-tasks + DB backend"

    def commands(self) -> list[list[str]]:
        return [
            _manage("db_worker", "--interval", "0.1", "--no-reload", "--worker-id", f"h_peers_{i}")
            for i in range(2)
        ]

    def arm(self, key: str, deadline: datetime) -> None:
        self.wake_up_in(key, deadline)

    def wake_up_in(self, key: str, deadline: datetime) -> None:
        from bench.peers.tasks import django_tasks_record

        django_tasks_record.using(run_after=deadline).enqueue(self.system, key)

    def enqueue_now(self, key: str, variant: str) -> None:
        """``enqueue`` with no ``run_after`` (its row, in the caller's transaction)."""
        from django.db import transaction

        from bench.peers.tasks import django_tasks_record

        with transaction.atomic():
            django_tasks_record.enqueue(self.system, key)

    def clean(self) -> None:
        from django_tasks_db.models import DBTaskResult

        DBTaskResult.objects.all().delete()

    def failures(self) -> int:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.filter(status="FAILED").count()


FACTORIES: dict[str, Callable[[], System]] = {
    "durable_agent": DurableAgent,
    "dq-alarm": lambda: DjangoQ(fast=True),
    "procrastinate": Procrastinate,
    "celery": Celery,
    "django-tasks": DjangoTasks,
    "dq-stock": lambda: DjangoQ(fast=False),
}


def build(names: Sequence[str]) -> list[System]:
    return [FACTORIES[name]() for name in FACTORIES if name in names]


def describe(system: Any) -> str:
    return f"{system.label} [{system.name}]"
