"""The pass history's trim (Note [One trim in twenty, in any order] in
durable_agent/maintenance/passes/finish.py): about one pass in twenty, in any order of hosts,
and each host's history bounded by ``PASS_HISTORY``."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durable_agent.maintenance.passes import run_pass
from durable_agent.maintenance.passes.finish import trims
from durable_agent.models import Host, PassRecord
from durable_agent.testing import FakeClock, ScriptedRuntime

pytestmark = pytest.mark.django_db

TRIM = 'SELECT "durable_agent_passrecord"."id"'


def _trims_by_host(passes: list[Host]) -> Counter[int]:
    """Run a pass of each host in turn; how many of each host's passes trimmed."""
    found: Counter[int] = Counter()
    for host in passes:
        with CaptureQueriesContext(connection) as queries:
            run_pass(host)
        found[host.pk] += sum(1 for q in queries.captured_queries if q["sql"].startswith(TRIM))
    return found


def test_a_round_robin_of_twenty_hosts_trims_about_one_pass_in_twenty(
    clock: FakeClock, runtime: ScriptedRuntime
) -> None:
    # Hosts created together and passing in turn: record ids and host ids advance together.
    # A rule on both (record_id % 20 == host.pk % 20) made all 400 passes trim, or none.
    hosts = [Host.objects.create(key=f"rr-{n:02d}") for n in range(20)]
    for host in hosts:
        run_pass(host)  # its first-use pass
    found = _trims_by_host(hosts * 20)
    assert 10 <= sum(found.values()) <= 30, found  # any 400 consecutive ids hold 16 to 25
    assert len(found) == 20
    assert PassRecord.objects.count() == 20 * 21  # every pass was recorded, none trimmed away


def test_trims__about_one_id_in_twenty_in_every_window_and_every_residue() -> None:
    ids = range(1, 40_001)
    chosen = [r for r in ids if trims(r)]
    assert 0.045 <= len(chosen) / len(ids) <= 0.055
    for hosts in (20, 37, 64):  # each host of a round robin gets its share
        share = Counter(r % hosts for r in chosen)
        expected = len(chosen) / hosts
        assert len(share) == hosts
        assert min(share.values()) >= expected / 2
    assert max(b - a for a, b in pairwise(chosen)) < 100


def test_a_hosts_history_stays_within_pass_history(
    clock: FakeClock, runtime: ScriptedRuntime, settings: object
) -> None:
    settings.DURABLE_AGENT = {**getattr(settings, "DURABLE_AGENT", {}), "PASS_HISTORY": 20}  # type: ignore[attr-defined]
    host = Host.objects.create(key="kept")
    for _ in range(120):
        run_pass(host)
    kept = PassRecord.objects.filter(host=host).count()
    assert 20 <= kept < 120  # trimmed to 20 at each trim, a few more between trims
    newest = PassRecord.objects.filter(host=host).order_by("-id").first()
    assert newest is not None
    assert PassRecord.objects.filter(host=host, id=newest.pk).exists()  # the newest survives
