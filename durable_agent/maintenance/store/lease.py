"""The pass lease: one pass per host at a time, across processes (docs/pass.md).

Taking the lease arms the slot no later than the lease's expiry, in the same short transaction:
a worker that dies mid-pass is retried within the lease TTL, and no path leaves a dirty host
with a disarmed slot. A busy delivery likewise leaves the slot armed no later than the running
pass's expiry. A heartbeat thread renews a long pass's lease.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.db import connections

from durable_agent import clock, conf
from durable_agent.maintenance.store.transactions import AlarmTx
from durable_agent.models import MaintenanceState

logger = logging.getLogger("durable_agent.maintenance")


@dataclass(frozen=True)
class Lease:
    host_id: int
    owner: str
    expires_at: datetime


@dataclass(frozen=True)
class Busy:
    host_id: int
    owner: str
    expires_at: datetime


@dataclass(frozen=True)
class Stale:
    """An alarm delivery with nothing to do: the slot moved later, or nothing is due."""

    host_id: int
    reason: str


def take(tx: AlarmTx, now: datetime, *, fired_for: datetime | None = None) -> Lease | Busy | Stale:
    """Take the host's pass lease inside an alarm transaction, or say why not.

    Arms the slot no later than the lease's expiry. With ``fired_for`` (the deadline an alarm
    delivery carries) this is also the early-fire guard: when the slot now holds a later time,
    or nothing is due, the delivery changes nothing but making sure the slot holds the
    earliest lane deadline.
    """
    state, checkpoint = tx.state, tx.checkpoint
    host_id = tx.host_id
    if fired_for is not None:
        earliest = tx.queue.next()
        if checkpoint.current is not None and checkpoint.current > now:
            return Stale(host_id, "the slot holds a later time")
        due = (
            state.dirty > state.processed
            or state.has_recovery_events
            or (earliest is not None and earliest <= now)
        )
        if not due:
            # This delivery consumed the slot: it now holds the earliest future deadline.
            tx.arm_at_earliest(now)
            return Stale(host_id, "nothing is due")
    held = state.pass_lease_expires_at
    if state.pass_lease_owner and held is not None and held > now:
        # This delivery consumed a due slot: wake again when the running lease expires (the
        # running pass re-arms the slot itself when it finishes).
        if checkpoint.current is None or checkpoint.current <= now:
            checkpoint.at(held)
        else:
            checkpoint.earlier(held)
        return Busy(host_id, state.pass_lease_owner, held)
    owner = uuid.uuid4().hex
    expires = now + conf.pass_lease_ttl()
    state.pass_lease_owner = owner
    state.pass_lease_expires_at = expires
    checkpoint.earlier(expires)
    return Lease(host_id, owner, expires)


def release_in(state: MaintenanceState, lease: Lease) -> None:
    """Give the lease back inside an alarm transaction (only if it is still ours)."""
    if state.pass_lease_owner == lease.owner:
        state.pass_lease_owner = None
        state.pass_lease_expires_at = None


def release(lease: Lease) -> None:
    """Give the lease back (only if it is still ours)."""
    MaintenanceState.objects.filter(host_id=lease.host_id, pass_lease_owner=lease.owner).update(
        pass_lease_owner=None, pass_lease_expires_at=None
    )


def renew(lease: Lease) -> bool:
    """Push the lease's expiry one TTL ahead; False when it is no longer ours."""
    updated = MaintenanceState.objects.filter(
        host_id=lease.host_id, pass_lease_owner=lease.owner
    ).update(pass_lease_expires_at=clock.now() + conf.pass_lease_ttl())
    return updated == 1


@contextmanager
def heartbeat(lease: Lease) -> Iterator[None]:
    """Renew the lease every third of its TTL while the block runs."""
    stop = threading.Event()
    interval = conf.pass_lease_ttl().total_seconds() / 3

    def beat() -> None:
        try:
            while not stop.wait(interval):
                if not renew(lease):
                    logger.warning("pass lease of host %s was lost", lease.host_id)
                    return
        except Exception:
            logger.exception("pass lease heartbeat of host %s failed", lease.host_id)
        finally:
            connections.close_all()

    thread = threading.Thread(target=beat, name=f"da-lease-{lease.host_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval + 5)
