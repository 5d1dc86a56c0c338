"""The fast path: a broker probe that runs django-q's scheduler as soon as a slot is due."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from durable_agent.broker import AlarmBroker, earliest_armed, next_armed_run
from durable_agent.maintenance import alarm, gate
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.models import Host, PassRecord
from durable_agent.testing import FakeClock, fake_clock
from tests.maintenance.helpers import caught_up
from tests.procs import ROOT, database_url
from tests.qdrive import run_enqueued

pytestmark = pytest.mark.django_db(transaction=True)


def test_probe__runs_the_scheduler_only_when_a_slot_is_due(db: None) -> None:
    start = timezone.now() - timedelta(seconds=30)  # the fake time lags: its slots are due
    with fake_clock(start) as clock:
        host = Host.objects.create(key="probe")
        caught_up(host)
        gate.schedule(host, LIFECYCLE, clock.now() + timedelta(hours=1))
        broker = AlarmBroker()
        assert next_armed_run() > timezone.now()  # type: ignore[operator]
        assert broker.fire_due_alarms() is False
        assert OrmQ.objects.count() == 0
        gate.schedule(host, LIFECYCLE, clock.now() + timedelta(seconds=1))
        assert broker.fire_due_alarms() is False  # rate-limited: probed moments ago
        broker._next_probe = 0.0
        assert broker.fire_due_alarms() is True
        assert OrmQ.objects.count() == 1
        assert Schedule.objects.get().repeats == 0  # django-q disarmed the fired ONCE slot
        clock.set(clock.now() + timedelta(seconds=1))
        (result,) = run_enqueued()
        assert result["phase"] in ("caught-up", "actionable")
        assert alarm.scheduled(host) is None


def test_probe__a_slot_due_before_the_next_probe_is_waited_for_and_fired(db: None) -> None:
    host = Host.objects.create(key="soon")
    caught_up(host)
    broker = AlarmBroker()
    broker.probe_interval = 5.0  # a long interval: the wait must come from the slot's time
    deadline = timezone.now() + timedelta(milliseconds=200)
    gate.schedule(host, LIFECYCLE, deadline)
    assert next_armed_run() == deadline
    assert broker.fire_due_alarms() is True
    assert timezone.now() > deadline  # it fired after the deadline, not before
    assert OrmQ.objects.count() == 1
    assert Schedule.objects.get().repeats == 0


def test_probe__after_a_firing_it_looks_again_at_once_but_not_at_a_stuck_slot(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import durable_agent.broker as broker_module

    host = Host.objects.create(key="stuck")
    caught_up(host)
    gate.schedule(host, LIFECYCLE, timezone.now())
    broker = AlarmBroker()
    broker.probe_interval = 60.0
    fired: list[int] = []
    monkeypatch.setattr(broker_module, "scheduler", lambda broker: fired.append(1))
    assert broker.fire_due_alarms() is True  # the slot is due; this scheduler cannot fire it
    assert broker.fire_due_alarms() is True  # a firing: looked again at once
    assert broker.fire_due_alarms() is False  # the same slot again: back to the probe rate
    assert len(fired) == 2
    monkeypatch.undo()
    broker._next_probe = 0.0
    assert broker.fire_due_alarms() is True  # django-q's scheduler fires it, at the probe rate
    assert OrmQ.objects.count() == 1
    other = Host.objects.create(key="next")
    caught_up(other)
    gate.schedule(other, LIFECYCLE, timezone.now())
    broker._next_probe = 0.0
    assert broker.fire_due_alarms() is True  # a new slot fires ...
    assert OrmQ.objects.count() == 2
    assert broker._next_probe == 0.0  # ... and the next dequeue probes again at once
    assert broker.fire_due_alarms() is False  # nothing armed is left


def test_probe__a_slot_due_after_the_next_probe_is_left_for_it(db: None) -> None:
    host = Host.objects.create(key="later")
    caught_up(host)
    gate.schedule(host, LIFECYCLE, timezone.now() + timedelta(seconds=5))
    broker = AlarmBroker()
    before = time.monotonic()
    assert broker.fire_due_alarms() is False
    assert time.monotonic() - before < 1  # no waiting for a slot past the probe interval
    assert OrmQ.objects.count() == 0
    assert next_armed_run() is not None


@pytest.mark.postgres
def test_index__probe_and_scheduler_scan_use_the_partial_index(clock: FakeClock) -> None:
    far = timezone.now() + timedelta(days=1)
    Schedule.objects.bulk_create(
        [Schedule(func="x.y", schedule_type="O", repeats=1, next_run=far) for _ in range(3000)]
        + [Schedule(func="x.y", schedule_type="O", repeats=0, next_run=far) for _ in range(3000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_q_schedule")
    now = timezone.now()
    probe = Schedule.objects.filter(next_run__lt=now).exclude(repeats=0)
    scan = (
        Schedule.objects.select_for_update()
        .exclude(repeats=0)
        .filter(next_run__lt=now)
        .filter(cluster__isnull=True)
    )
    earliest = earliest_armed()[:1]  # the fast path's probe, exactly
    for query in (probe, scan, earliest):
        with transaction.atomic(), connection.cursor() as cursor:
            sql, params = query.query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "da_schedule_armed_next_run" in plan, plan
        assert "Seq Scan" not in plan, plan


@pytest.mark.postgres
def test_live_cluster__a_slot_armed_one_second_ahead_fires_its_pass() -> None:
    host = Host.objects.create(key="live")
    caught_up(host)
    deadline = timezone.now() + timedelta(seconds=1)
    gate.schedule(host, LIFECYCLE, deadline)
    assert alarm.scheduled(host) == deadline
    env = {**os.environ, "DATABASE_URL": database_url(), "Q_WORKERS": "2"}
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    record, slot, exited = None, deadline, None
    try:
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            exited = cluster.poll()
            if exited is not None:
                break
            # The pass that ran the due lane (a slow pass may also see a "busy" re-delivery).
            # Matched by host, not by the exact deadline: one CI run found the pass recorded
            # but not under this deadline; the context below prints both to find out why.
            record = (
                PassRecord.objects.filter(host=host, deadline__isnull=False)
                .exclude(phase__in=["busy", "stale"])
                .first()
            )
            slot = alarm.scheduled(host)
            if record is not None and slot is None:
                break
            time.sleep(0.05)  # polling an observable condition
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            output, _ = cluster.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            cluster.kill()
            output, _ = cluster.communicate()
    seen = PassRecord.objects.filter(host=host).values_list("phase", "deadline", "error")
    context = (
        f"deadline {deadline!r}; exited early: {exited}; passes: {list(seen)}; "
        f"cluster output:\n{output}"
    )
    assert record is not None, "the pass did not run; " + context
    assert record.phase in ("caught-up", "actionable"), context
    assert record.deadline is not None
    assert abs((record.deadline - deadline).total_seconds()) < 5, context
    assert record.lateness_ms is not None
    assert record.lateness_ms < 5_000, context  # well inside the stock scheduler's 30 s scan
    assert slot is None, context
    assert cluster.returncode == 0, output
