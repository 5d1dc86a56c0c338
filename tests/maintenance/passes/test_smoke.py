from __future__ import annotations

from datetime import timedelta

import pytest

from durable_agent.maintenance import alarm, gate
from durable_agent.models import MaintenanceState
from durable_agent.testing import FakeClock


@pytest.mark.django_db
def test_gate_transaction__arms_the_slot(host, clock: FakeClock) -> None:
    with gate.transaction(host) as tx:
        tx.schedule("outbox", clock.now() + timedelta(seconds=5))
    # A fresh host owes one native pass (dirty=1, processed=0): the slot holds the minimum delay.
    assert alarm.scheduled(host) == clock.now() + timedelta(milliseconds=50)
    state = MaintenanceState.objects.get(host=host)
    assert (state.dirty, state.processed) == (1, 0)
