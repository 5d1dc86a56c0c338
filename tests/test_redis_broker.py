"""AlarmRedisBroker: the alarm fast path with django-q2's Redis broker carrying the tasks.

These tests need a Redis: ``REDIS_URL`` (default ``redis://127.0.0.1:6379/7``). Where none
answers they fail when ``CI=true`` (CI provides one) and are skipped elsewhere, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from durable_agent.maintenance import alarm, gate
from durable_agent.maintenance.lane_ids import LIFECYCLE
from durable_agent.models import Host, PassRecord
from tests.maintenance.helpers import caught_up
from tests.procs import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/7")


@pytest.fixture
def redis_url() -> str:
    import redis

    try:
        redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        message = f"No Redis answers at REDIS_URL={REDIS_URL}: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return REDIS_URL


@pytest.fixture
def queue_name(redis_url: str) -> Iterator[str]:
    """A cluster name of this test's own, its Redis keys deleted afterwards."""
    import redis

    name = f"da_test_{os.getpid()}_{time.monotonic_ns()}"
    yield name
    client = redis.from_url(redis_url)
    keys = list(client.scan_iter(f"django_q:{name}:*"))
    if keys:
        client.delete(*keys)


def test_redis_broker__a_fired_task_skips_redis_and_others_go_through_it(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.redis_broker import AlarmRedisBroker

    monkeypatch.setattr(Conf, "REDIS", redis_url)
    broker = AlarmRedisBroker(list_key=queue_name)
    broker.listen = False
    host = Host.objects.create(key="redis")
    caught_up(host)
    gate.schedule(host, LIFECYCLE, timezone.now())
    tasks = None
    for _ in range(20):
        broker._next_sweep = float("inf")
        tasks = broker.dequeue()
        if tasks:
            break
    assert tasks is not None
    assert len(tasks) == 1
    assert tasks[0][0] is None
    assert broker.queue_size() == 0  # handed over directly, never pushed
    assert OrmQ.objects.count() == 0
    assert alarm.scheduled(host) is None  # django-q disarmed the fired slot
    broker.enqueue(tasks[0][1])  # any other enqueue goes through Redis
    assert broker.queue_size() == 1
    assert broker.ready_tasks() == [(None, tasks[0][1].encode())]  # Redis returns bytes
    assert broker.ready_tasks() is None


@pytest.mark.postgres
def test_live_cluster__alarms_fire_with_the_redis_broker(redis_url: str, queue_name: str) -> None:
    host = Host.objects.create(key="live-redis")
    caught_up(host)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.redis_settings",
        "Q_REDIS": redis_url,
        "Q_NAME": queue_name,
        "Q_WORKERS": "2",
    }
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    records: list[PassRecord] = []
    prompt: list[PassRecord] = []
    try:
        time.sleep(2)  # the cluster starts; the alarms below are armed while it runs
        # Due later than now: no prompt hint, the slot fires (Note [Prompt hint]).
        for count, offset_ms in enumerate((300, 1500), start=1):
            gate.schedule(host, LIFECYCLE, timezone.now() + timedelta(milliseconds=offset_ms))
            give_up = time.monotonic() + 20
            while time.monotonic() < give_up and len(records) < count:
                records = list(PassRecord.objects.filter(host=host, deadline__isnull=False))
                time.sleep(0.05)  # polling an observable condition
        # Due now: the hint reaches the Redis broker's pusher, which runs a prompt pass.
        gate.schedule(host, LIFECYCLE, timezone.now())
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up and not prompt:
            prompt = list(PassRecord.objects.filter(host=host, deadline__isnull=True))
            time.sleep(0.05)  # polling an observable condition
    finally:
        cluster.terminate()
        try:
            output, _ = cluster.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            cluster.kill()
            output, _ = cluster.communicate()
    assert len(records) >= 2, output
    assert len(prompt) == 1, output  # a prompt pass (no slot deadline) ran the lane due now
    assert all(r.lateness_ms is not None and r.lateness_ms < 5_000 for r in records), output
    assert OrmQ.objects.count() == 0, output  # the tasks travelled through Redis
    assert alarm.scheduled(host) is None, output
    assert cluster.returncode == 0, output
