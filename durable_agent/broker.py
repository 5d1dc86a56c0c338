"""django-q brokers that fire due alarm slots within milliseconds (the fast path).

django-q2's own scheduler scans the ``Schedule`` table only every ~30 s, inside the cluster's
sentinel. These brokers move that scan into the pusher (Note [The pusher is the cluster's
scheduler]) and run the firing loop in its dequeue (Note [Wake at the deadline]): they learn
of due slots from a PostgreSQL notification (``durable_agent/alarm_listener.py``, migration
0009's trigger) and from a cheap probe (the earliest armed ``next_run``, an index-only lookup
on the partial index ``da_schedule_armed_next_run``), and fire at the deadline: alarm slots a
batch at a time (Note [Fire alarm slots in batches]), with django-q's ONCE semantics
(``repeats``, the ``deadline`` kwarg, the transactional enqueue), anything else with django-q's
``scheduler()``. The tasks a firing enqueued are handed to this cluster's workers at once.

Enable it in settings::

    Q_CLUSTER = {..., "orm": "default", "poll": 0.05,
                 "broker_class": "durable_agent.broker.AlarmBroker"}

or, with django-q2's Redis broker carrying the tasks (the slots stay in the database),
``"broker_class": "durable_agent.redis_broker.AlarmRedisBroker"`` and ``"redis": ...``.

Cost per cluster: on PostgreSQL one probe a second and one dedicated LISTEN connection; on
other databases one probe every 0.1 s; the backstop sweep (``durable_agent.tasks.sweep``, three
indexed queries, then one batch of retention deletes per pruned table) once a minute.

It also makes a cluster stop when SIGTERM reaches its whole process group or cgroup (Note
[SIGTERM to the group]).

Size: most of it is ``AlarmFiring``, one loop whose steps (probe, listener, firing a batch,
handing its tasks over, the sweep) share the state ``_init_firing`` sets and are explained by
its Notes together; the ORM broker and the SIGTERM hook around it are short.
"""

from __future__ import annotations

import ast
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Q
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signals import post_spawn
from django_q.tasks import async_task

from durable_agent import conf
from durable_agent import tasks as alarm_tasks
from durable_agent.alarm_listener import AlarmListener, Wake
from durable_agent.text import duration

logger = logging.getLogger("durable_agent.broker")

PROBE_INTERVAL = 0.1  # without notifications (SQLite, or the listener is down)
PROMPT_TASK = "durable_agent.tasks.prompt_pass"
BATCH = "durable_agent:alarms"  # the django-q group of its tasks
LISTENING_PROBE_INTERVAL = 1.0  # with them: the trigger covers the next 2 s
BACKSTOP_SECONDS = 30.0  # as django-q's guard (Note [The pusher is the cluster's scheduler])


def _mine() -> Q:
    """The schedules this cluster runs (django-q's scheduler's own filter)."""
    mine = Q(cluster=Conf.CLUSTER_NAME)
    if Conf.CLUSTER_NAME == Conf.PREFIX:
        mine |= Q(cluster__isnull=True)
    return mine


def _is_mine(wake: Wake) -> bool:
    if wake.cluster is None:
        return bool(Conf.CLUSTER_NAME == Conf.PREFIX)
    return bool(wake.cluster == Conf.CLUSTER_NAME)


def next_armed_run() -> datetime | None:
    """The earliest ``next_run`` of an armed schedule this cluster runs, or None.

    The first entry of the partial index ``da_schedule_armed_next_run``: one index probe,
    whatever the number of armed hosts.
    """
    first: datetime | None = earliest_armed().first()
    return first


def earliest_armed() -> Any:
    """The probe's query: armed schedules of this cluster by ``next_run`` (values only)."""
    return (
        Schedule.objects.filter(_mine())
        .exclude(repeats=0)
        .order_by("next_run")
        .values_list("next_run", flat=True)
    )


def hosts_per_task() -> int:
    """How many hosts one alarm delivery carries at most: ``ALARM_BATCH_HOSTS`` when the
    slots run the default alarm task (``fire_alarms`` runs it per host), else 1."""
    if conf.alarm_task() != conf.get_default("ALARM_TASK"):
        return 1
    return max(1, int(conf.get("ALARM_BATCH_HOSTS")))


def _batch_host(slot: Schedule) -> int | None:
    """The host of an alarm slot ``fire_alarms`` may carry (the default task, its host its only
    argument, the deadline as its ``deadline`` kwarg, no hook), else None."""
    if slot.hook or slot.intended_date_kwarg != "deadline":
        return None
    try:
        args = _slot_args(slot)
    except (ValueError, SyntaxError):
        return None
    return args[0] if len(args) == 1 and type(args[0]) is int else None


def _slot_args(slot: Schedule) -> tuple[Any, ...]:
    """The positional arguments of the task ``slot`` runs (django-q's ``args``, a literal)."""
    args = ast.literal_eval(slot.args) if slot.args else ()
    return args if type(args) is tuple else (args,)


def disarm_fired(alias: str, slots: list[Schedule]) -> None:
    """Write each fired slot's ``task`` and ``repeats`` = 0: one ``UPDATE`` with a ``CASE``
    over the ids, written out (``bulk_update`` builds the same statement from one expression
    per slot, which took more than half of the pusher's CPU in a burst, docs/benchmarks.md).
    As ``bulk_update`` does, a database with a limit on a statement's parameters (SQLite)
    gets as many statements as the limit needs; PostgreSQL gets one."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    pk, task = quote(Schedule._meta.pk.column), quote(Schedule._meta.get_field("task").column)
    repeats = quote(Schedule._meta.get_field("repeats").column)
    size = max(1, connection.ops.bulk_batch_size(["pk", "task", "pk"], slots))
    with connection.cursor() as cursor:
        for start in range(0, len(slots), size):
            chunk = slots[start : start + size]
            whens = " ".join(["WHEN %s THEN %s"] * len(chunk))
            ids = ", ".join(["%s"] * len(chunk))
            params: list[Any] = [value for slot in chunk for value in (slot.pk, slot.task)]
            cursor.execute(
                f"UPDATE {quote(Schedule._meta.db_table)} SET {repeats} = 0, "
                f"{task} = CASE {pk} {whens} END WHERE {pk} IN ({ids})",
                params + [slot.pk for slot in chunk],
            )


def fire_ahead_lead() -> timedelta:
    """``FIRE_AHEAD_MS`` as a timedelta (zero: fire at the deadline)."""
    return timedelta(milliseconds=int(conf.get("FIRE_AHEAD_MS")))


class AlarmFiring:
    """The firing loop shared by the alarm brokers (mixed into a django-q broker class).

    A subclass provides ``ready_tasks()`` (claim what is queued, never waiting) and
    ``claim_fired()`` (the tasks the last firing enqueued, once committed), and calls
    ``_init_firing()`` from its ``__init__``; ``dequeue()`` is built here.

    Note [Wake at the deadline]
        The loop keeps ``due_at``, the earliest armed deadline it knows of, learnt from the
        probe (every ``probe_interval``) or from a notification. Whenever the queue is empty it
        waits on the listener (or sleeps, without one) no longer than the broker's ``poll``,
        the next probe, and ``due_at`` plus a millisecond (django-q fires ``next_run < now``),
        so a known slot fires within milliseconds of its deadline and a slot armed for "now"
        within milliseconds of its commit. On PostgreSQL the trigger of migration 0009 notifies
        every slot armed at most 2 s ahead, and the probe runs once a second to find the
        others before they are due; without notifications (SQLite, or while the listener
        reconnects) the probe runs every 0.1 s and a slot armed closer than that fires at the
        next probe. After a firing the loop probes again at once, so alarms due close together
        each fire on time; a slot the scheduler could not fire (it logs why and rolls back) is
        retried at the probe rate, never in a tight loop. A firing fires one batch of alarm
        slots (Note [Fire alarm slots in batches]) and, when that batch was not full, runs
        django-q's ``scheduler()`` for the rest. The tasks a firing enqueues for this cluster
        (up to ``bulk`` of them; more from the stock scheduler are queued for every cluster)
        are handed to the pusher in the same dequeue, once the firing's transaction commits,
        without another query: the ORM broker inserts their rows already claimed, the Redis
        broker never pushes them.

    Note [Fire ahead, run at the deadline]
        Firing at the deadline makes every alarm late by the firing's transaction, the
        hand-over to a worker and the delivery's start, a few milliseconds each. So the loop
        wakes ``FIRE_AHEAD_MS`` (10 ms) before the earliest deadline it knows of and fires the
        alarm slots due within that lead then (``fire_alarm_batch(due_before=...)``); each
        worker holds its delivery until the deadline (``durable_agent.tasks.fire_alarm``), so
        the pass starts at the deadline, never before it (Celery holds an ``eta`` task in the
        worker the same way). Nothing else changes: the slot is disarmed as at any firing, a
        delivery more than the lead early is not held (the pass's early-fire guard handles
        it), and a slot of anything else, or a slot the batch could not take, is fired at its
        deadline as before (``_fired_ahead`` remembers the deadline already tried). A held
        delivery keeps its worker for at most the lead; under a backlog nothing is held, as
        every deadline is past.

    Size: one loop over the state ``_init_firing`` sets; its steps are read together with
    Note [Wake at the deadline] and Note [Fire alarm slots in batches], and the Redis broker
    mixes in the whole of it.
    """

    probe_interval = PROBE_INTERVAL
    listening_probe_interval = LISTENING_PROBE_INTERVAL
    listen = True  # a subclass or a test may turn the listener off
    prompt = True  # start hinted hosts' passes at once (Note [Prompt start]); a test may not

    def _init_firing(self) -> None:
        self._next_probe = 0.0
        self._last_fired: datetime | None = None
        self._fired_ahead: datetime | None = None  # Note [Fire ahead, run at the deadline]
        self._next_sweep = 0.0  # once at start: a restarted cluster re-arms lost alarms first
        self._failing_since: float | None = None  # Note [The pusher is the cluster's scheduler]
        self.due_at: datetime | None = None
        self._fired: list[Any] = []
        self._firing = False
        self._kept = 0
        self._batch: list[Any] | None = None  # tasks held back during fire_alarm_batch
        self._enqueue_label: str | None = None  # Note [What a firing's enqueue returns]
        self._stop_wait: tuple[float, int] | None = None  # Note [A stopping cluster waits]
        self._prompts: list[int] = []  # hosts hinted, not yet handed over (Note [Prompt start])
        self._prompted: list[Any] = []
        self._prompting = False
        self.listener: AlarmListener | None = None
        self._listener_checked = False

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        self._init_firing()

    # -- the listener ------------------------------------------------------------------------

    def _listener(self) -> AlarmListener | None:
        """The listener, created on first use on PostgreSQL (None elsewhere)."""
        if not self._listener_checked:
            self._listener_checked = True
            alias = router.db_for_write(Schedule)
            if self.listen and connections[alias].vendor == "postgresql":
                self.listener = AlarmListener(alias)
        return self.listener

    def current_probe_interval(self) -> float:
        listener = self._listener()
        if listener is not None and listener.connected:
            return self.listening_probe_interval
        return self.probe_interval

    def ping(self) -> bool:
        """django-q's sentinel pings its broker first thing; see Note [SIGTERM to the group]
        and Note [The pusher is the cluster's scheduler].

        Note [The pusher is the cluster's scheduler]
            django-q's sentinel runs ``scheduler()`` in its guard loop every ~30 s: one
            transaction that locks every due schedule of the cluster ``FOR UPDATE`` (waiting,
            not skipping) and fires each, an alarm slot included, as a task of its own. With
            this broker the pusher already fires whatever of the cluster is due (its probe reads
            the same rows: armed, of this cluster), alarm slots a batch at a time; the guard's
            scan only competes with it. In a 10 000-host burst it met the drain in two rounds
            of three and fired up to 8 656 slots one task a host; while it held them, the
            pusher's batch firings skipped them and its own ``scheduler()`` waited on their
            locks (docs/benchmarks.md, "A group's finishes together"). So in the sentinel
            ``ping()`` turns that scan off (``Conf.SCHEDULER``, which django-q reads there
            alone: the sentinel's process only, before it forks its children) and the pusher
            keeps the backstop: when its firings have failed for ``BACKSTOP_SECONDS`` (30 s,
            the guard's period) without one succeeding, it runs the stock ``scheduler()``
            itself, and again every 30 s while they fail (``_backstop``); a failure that passes
            is retried at the probe rate as before. A cluster with another broker keeps
            django-q's scan; ``"scheduler": False`` in ``Q_CLUSTER`` never stopped this
            broker's firing and does not now.
        """
        if _in_sentinel():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            Conf.SCHEDULER = False  # Note [The pusher is the cluster's scheduler]
        return bool(super().ping())  # type: ignore[misc]

    def set_stat(self, key: str, value: str, timeout: int) -> None:
        """django-q's sentinel saves its status through its broker every guard cycle and every
        0.1 s while it stops; see Note [A stopping cluster waits]."""
        self.log_stop_wait(_sentinel_on_stack())
        super().set_stat(key, value, timeout)  # type: ignore[misc]

    def log_stop_wait(self, sentinel: Any) -> None:
        """Log once that a stopping cluster waits for running tasks, and once how long it did.

        Note [A stopping cluster waits]
            A stopping django-q2 cluster stops its pusher, then waits for each worker to finish
            the task it runs (a maintenance pass ends by its yield deadline or the cluster's
            ``timeout``), silently. The sentinel saves its status through this broker every
            0.1 s meanwhile, so here, in the sentinel, the first save of a stopping cluster
            with busy workers logs how many and the longest they may take (a busy worker's
            ``timer``: the seconds left before its task's timeout, plus django-q's 3 s), and
            the first save after they are done logs how long the cluster waited.
        """
        if sentinel is None or not sentinel.stop_event.is_set():
            return
        busy = [p for p in sentinel.pool if p.is_alive() and p.timer.value > 0]
        if self._stop_wait is None:
            if busy:
                self._stop_wait = (time.monotonic(), len(busy))
                logger.info(
                    "Q Cluster stopping: waiting for %s to finish the running task "
                    "(a maintenance pass), at most %s",
                    "1 busy worker" if len(busy) == 1 else f"{len(busy)} busy workers",
                    duration(max(p.timer.value for p in busy) * 1000),
                )
        elif not busy and self._stop_wait[1]:
            started, count = self._stop_wait
            self._stop_wait = (started, 0)
            logger.info(
                "Q Cluster stopping: the running %s finished after %s",
                "task" if count == 1 else "tasks",
                duration((time.monotonic() - started) * 1000),
            )

    # -- the loop ----------------------------------------------------------------------------

    def dequeue(self) -> Any:
        self.sweep_if_due()
        prompted = self.prompt_tasks()
        if prompted:
            return prompted
        if self.fire_due_alarms():
            fired = self.claim_fired()
            if fired:
                return fired
        tasks = self.ready_tasks()
        if tasks:
            return tasks
        self.wait(float(Conf.POLL))
        return None

    def ready_tasks(self) -> Any:
        raise NotImplementedError

    def prompt_tasks(self) -> list[Any]:
        """A ``prompt_pass`` task for each host hinted since the last look, for this
        cluster's own workers: no queue row, no slot firing (Note [Prompt start] in
        ``durable_agent/maintenance/passes/run.py``). django-q's ``async_task`` builds each
        task as for any other; ``enqueue`` hands it back here instead of queueing it."""
        if not self._prompts:
            return []
        hosts = list(dict.fromkeys(self._prompts))
        self._prompts, self._prompted, self._prompting = [], [], True
        try:
            for host in hosts:
                async_task(
                    PROMPT_TASK,
                    host,
                    q_options={"broker": self, "group": f"durable_agent:host:{host}"},
                )
        except Exception:  # a lost hint: the slot is the backstop
            logger.exception("Starting prompt passes failed")
        finally:
            self._prompting = False
        prompted, self._prompted = self._prompted, []
        return prompted

    def _take_prompt(self, task: Any) -> bool:
        """Keep ``task`` for ``prompt_tasks`` when it is one of them (``enqueue`` asks)."""
        if not self._prompting:
            return False
        self._prompted.append((None, task))  # no broker row: nothing to acknowledge
        return True

    def queued_label(self) -> str:
        """What ``enqueue`` returns for a task whose row or push waits for the firing's commit.

        Note [What a firing's enqueue returns]
            django-q's ``async_task`` logs ``Enqueued [<queue>] <what enqueue returned>`` for
            every task, the broker's id of the task (an ``OrmQ`` primary key). A task a firing
            enqueues has no such id yet: its row is inserted with its batch (``flush_batch``)
            or it is pushed when the firing commits. Rather than ``None``, the line names the
            alarm slot that fired (``durable_agent:host:<id> (alarm slot)``), or says when the
            task goes out.
        """
        return self._enqueue_label or "(queued when the firing commits)"

    def _keep_fired(self) -> bool:
        """Whether the task being enqueued goes to this cluster's own workers: during a firing,
        the first ``bulk`` of its tasks (what one dequeue takes); the others are queued for
        every cluster, so a burst is shared out rather than held by the cluster that fired it."""
        if not self._firing or self._kept >= Conf.BULK:
            return False
        self._kept += 1
        return True

    def _on_commit(self, callback: Any) -> None:
        """Run ``callback`` when the firing's transaction (django-q's scheduler) commits."""
        transaction.on_commit(callback, using=router.db_for_write(Schedule))

    def claim_fired(self) -> Any:
        raise NotImplementedError

    def sweep_if_due(self) -> bool:
        """Run the backstop sweep (``durable_agent.tasks.sweep``) when the cluster starts and then
        every ``SWEEP_INTERVAL_MS`` (a minute by default)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return False
        self._next_sweep = now + int(conf.get("SWEEP_INTERVAL_MS")) / 1000

        try:
            alarm_tasks.sweep()
        except Exception:
            logger.exception("The alarm sweep failed")
            return False
        return True

    def _learn(self, due: datetime | None) -> None:
        if due is not None and (self.due_at is None or due < self.due_at):
            self.due_at = due

    def probe(self) -> None:
        """Read the earliest armed deadline into ``due_at`` (rate-limited by the probe interval)."""
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + self.current_probe_interval()
        self.due_at = next_armed_run()

    def fire_due_alarms(self) -> bool:
        """Probe (rate-limited) and fire when a slot is due; True if it fired.

        First one batch of due alarm slots (``fire_alarm_batch``); when that batch fired at
        least ``bulk`` slots more may be due, and the next dequeue fires the next batch once the
        pusher has handed this one over. Otherwise django-q's stock ``scheduler()`` fires
        whatever else is due.

        Note [The stock scheduler runs after a short firing]
            django-q's ``scheduler()`` locks every due schedule of its cluster with a plain
            ``SELECT ... FOR UPDATE`` in no set order, alarm slots included. Two clusters running
            it at once while a burst's slots are still due can each hold a slot the other
            waits for: PostgreSQL then reports a deadlock and one firing rolls back. So it runs
            only once the alarm slots are drained, when a firing fired fewer than ``bulk`` of
            them (each batch takes up to ``bulk`` times ``ALARM_BATCH_HOSTS``, Note [Several
            hosts per delivered task], and may come out short only because another cluster
            holds the rest); ``bench.clusters`` with four clusters showed the deadlock when
            any batch shorter than its size ran it.
        """
        try:
            fired = self._fire_due()
        except Exception:
            logger.exception("Firing due alarm slots failed")
            self._backstop()
            return False
        self._failing_since = None
        return fired

    def _fire_due(self) -> bool:
        self.probe()
        first = self.due_at
        if first is None:
            return False
        now = timezone.now()
        if first >= now:
            return self.fire_ahead(first, now)
        stuck = first == self._last_fired  # the last firing left this very slot armed
        self.due_at = None
        with self._firing_round():
            if self.fire_alarm_batch() >= max(1, int(Conf.BULK)):
                self.due_at = first  # still due (or fired): fire again without a probe
                return True
            scheduler(broker=self)  # Note [The stock scheduler runs after a short firing]
        self._last_fired = first
        if not stuck:  # while slots keep coming due, look again at once
            self._next_probe = 0.0
        return True

    def _backstop(self) -> None:
        """Once firings have failed for ``BACKSTOP_SECONDS`` without one succeeding, django-q's
        stock ``scheduler()`` (which logs its own errors and fires nothing when it fails), and
        again every ``BACKSTOP_SECONDS`` while they keep failing (Note [The pusher is the
        cluster's scheduler])."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since < BACKSTOP_SECONDS:
            return
        self._failing_since = now
        scheduler(broker=self)

    @contextmanager
    def _firing_round(self) -> Iterator[None]:
        """One firing: the tasks it enqueues are collected for this cluster (``_keep_fired``)."""
        self._fired = []
        self._kept = 0
        self._firing = True
        try:
            yield
        finally:
            self._firing = False

    def fire_ahead(self, first: datetime, now: datetime) -> bool:
        """Fire the alarm slots due within ``FIRE_AHEAD_MS`` of ``now`` when the earliest known
        deadline ``first`` is that close; True if any fired (Note [Fire ahead, run at the
        deadline])."""
        lead = fire_ahead_lead()
        if not lead or first >= now + lead or first == self._fired_ahead:
            return False
        self._fired_ahead = first
        with self._firing_round():
            fired = self.fire_alarm_batch(due_before=now + lead)
        if not fired:  # not an alarm slot, or held elsewhere: fired at its deadline instead
            return False
        if fired >= self.fire_batch_size():
            self._fired_ahead = None  # more may be due within the lead: fire again at once
        else:
            self.due_at = None
            self._next_probe = 0.0  # learn the next deadline at once
        return True

    def fire_batch_size(self) -> int:
        """How many alarm slots one firing transaction fires: one dequeue's worth (``bulk``)
        of tasks, each carrying up to ``ALARM_BATCH_HOSTS`` hosts when slots fire together
        (Note [Several hosts per delivered task])."""
        return max(1, int(Conf.BULK)) * hosts_per_task()

    def _split(
        self, slots: list[Schedule]
    ) -> tuple[list[Schedule], list[list[tuple[int, Schedule]]]]:
        """The slots that fire a task each, and the groups of ``(host, slot)`` that fire one
        ``fire_alarms`` task together (Note [Several hosts per delivered task])."""
        per_task = hosts_per_task()
        single: list[Schedule] = []
        batchable: dict[str | None, list[tuple[int, Schedule]]] = {}
        for slot in slots:
            host = _batch_host(slot) if per_task > 1 else None
            if host is None:
                single.append(slot)
            else:
                batchable.setdefault(slot.cluster, []).append((host, slot))
        together: list[list[tuple[int, Schedule]]] = []
        for pairs in batchable.values():
            tasks = min(len(pairs), max(-(-len(pairs) // per_task), int(Conf.WORKERS)))
            for group in (pairs[i::tasks] for i in range(tasks)):
                if len(group) == 1:
                    single.append(group[0][1])
                else:
                    together.append(group)
        return single, together

    def fire_alarm_batch(self, due_before: datetime | None = None) -> int:
        """Fire up to ``fire_batch_size()`` due alarm slots of this cluster in one transaction,
        the earliest first; return how many fired. A slot is due when its deadline is before
        ``due_before`` (default: now; Note [Fire ahead, run at the deadline]).

        Note [Fire alarm slots in batches]
            django-q's ``scheduler()`` fires every due slot in one transaction, each with an
            enqueue and a ``Schedule`` save, before any worker gets a task: a burst of a
            thousand slots due at once waits seconds for its first pass. Alarm slots
            (``func`` the alarm task, ONCE, ``repeats`` > 0, no ``kwargs``: the rows
            ``durable_agent/maintenance/store/alarm.py`` writes) are fired here instead, a batch
            at a time, with the stock semantics: each gets one task built by django-q's own
            ``async_task`` (its ``deadline`` kwarg from ``intended_date_kwarg``, its group the
            schedule's name, its hook), its ``task`` id recorded and ``repeats`` set to 0, all
            in one transaction: the rows are locked with SKIP LOCKED (a slot a pass or another
            cluster holds is left to the next firing), the tasks inserted with one statement
            and the slots written with one. A rolled-back batch fires nothing. Every task of
            the batch is this cluster's (``_keep_fired``), handed to its pusher once the
            transaction commits, so the next batch fires only when the pusher comes back for
            more work: a burst is shared between clusters at the rate each one runs it, and
            a slot waits armed, never disarmed with its task queued, until a pusher takes it.

        Note [Several hosts per delivered task]
            django-q spends per task what no pass needs once per host: the pusher's pickling
            and signing and the queue hand-over, the worker's connection health check, the
            monitor's acknowledgement with its own health check. When several alarm slots of
            the default alarm task fire together, the firing takes up to ``bulk`` times
            ``ALARM_BATCH_HOSTS`` of them and gives each of at most ``bulk`` tasks (and at
            least as many as there are workers, while there are hosts for them) a share of
            the slots, dealt in deadline order, so each worker starts with the earliest; the
            task ``durable_agent.tasks.fire_alarms`` runs its hosts' passes one after the
            other, each as ``fire_alarm`` runs it (held until its deadline, the early-fire
            guard, its own lease, its own completion, its own record), but for its begin: on
            PostgreSQL a group of up to four hosts begins in one transaction (Note [A
            delivery's passes begin together] in
            ``durable_agent/tasks.py``). A task left with one host is an
            ordinary ``fire_alarm`` task, so alarms that do not come due together are
            delivered as before. One host's failure is logged and recorded by its pass and
            does not stop the next; the task raises once the others ran, so django-q records
            the failure. A delivery begins no new group after ``BATCH_BUDGET_SECONDS``: the
            hosts left are re-armed, due at once, so a long pass delays by itself the others
            of its group alone. A delivery that dies (its worker killed) leaves each host of a
            group it began armed at that host's lease's expiry; the slots of its hosts not yet
            begun stay fired and disarmed, as a lost single delivery leaves its host: django-q
            redelivers the task after ``retry``, and the sweep re-arms each such host once its
            deadline is ``SWEEP_GRACE_MS`` old (Note [A fired slot is not a lost one] in
            ``durable_agent/tasks.py``).
        """
        alias = router.db_for_write(Schedule)
        self._batch = []
        try:
            with transaction.atomic(using=alias):
                slots = list(
                    Schedule.objects.using(alias)
                    .select_for_update(skip_locked=True, of=("self",))
                    .filter(_mine(), func=conf.alarm_task(), schedule_type=Schedule.ONCE)
                    .filter(Q(kwargs__isnull=True) | Q(kwargs=""))
                    .filter(repeats__gt=0, next_run__lt=due_before or timezone.now())
                    .order_by("next_run")[: self.fire_batch_size()]
                )
                single, together = self._split(slots)
                for slot in single:
                    args = _slot_args(slot)
                    q_options: dict[str, Any] = {
                        "broker": self,
                        "cluster": slot.cluster,
                        "group": slot.name or slot.id,
                    }
                    if slot.hook:
                        q_options["hook"] = slot.hook
                    kwargs: dict[str, Any] = {"q_options": q_options}
                    if slot.intended_date_kwarg:
                        kwargs[slot.intended_date_kwarg] = slot.next_run.isoformat()
                    self._enqueue_label = f"{slot.name or slot.id} (alarm slot)"
                    slot.task = async_task(slot.func, *args, **kwargs)
                    slot.repeats = 0
                for group in together:
                    self._enqueue_label = f"{', '.join(s.name for _, s in group)} (alarm slots)"
                    q_options = {"broker": self, "cluster": group[0][1].cluster, "group": BATCH}
                    task = async_task(
                        conf.BATCH_ALARM_TASK,
                        [[host, slot.next_run.isoformat()] for host, slot in group],
                        q_options=q_options,
                    )
                    for _, slot in group:
                        slot.task, slot.repeats = task, 0
                self.flush_batch(alias)
                disarm_fired(alias, slots)
        finally:
            self._batch = None
            self._enqueue_label = None
        return len(slots)

    def flush_batch(self, alias: str) -> None:
        """Write the tasks ``enqueue`` held back during ``fire_alarm_batch`` (none by default)."""

    def wait(self, poll: float) -> None:
        """Idle until the poll ends, the next probe, the known deadline or a notification."""
        now = time.monotonic()
        timeout = min(poll, max(0.0, self._next_probe - now))
        if self.due_at is not None:
            wake_at = self.due_at + timedelta(milliseconds=1)  # django-q fires next_run < now
            lead = fire_ahead_lead()
            if lead and self.due_at != self._fired_ahead:
                wake_at = self.due_at - lead  # Note [Fire ahead, run at the deadline]
            until_due = (wake_at - timezone.now()).total_seconds()
            timeout = min(timeout, max(0.0, until_due))
        listener = self._listener()
        if listener is None:
            time.sleep(timeout)
            return
        for wake in listener.wait(timeout):
            if wake.host is not None:  # Note [Prompt start]
                if self.prompt and _is_mine(wake):
                    self._prompts.append(wake.host)
            elif wake.due is None:  # (re)connected: whatever was notified meanwhile is lost
                self._next_probe = 0.0
            elif _is_mine(wake):
                self._learn(wake.due)


class AlarmBroker(AlarmFiring, ORM):  # type: ignore[misc]
    """The ORM broker plus the fast path (Note [Wake at the deadline])."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self._init_firing()

    def enqueue(self, task: Any) -> Any:
        """django-q's enqueue, but a task this cluster keeps (``_keep_fired``) is inserted
        already claimed by it (its lock at ``now + retry``, as a dequeue would set it) and
        handed to the pusher when the scheduler's transaction commits (Note [Wake at the
        deadline])."""
        if self._take_prompt(task):
            return "(prompt pass)"
        if not self._keep_fired():
            return super().enqueue(task)
        if self._batch is not None:  # fire_alarm_batch inserts them together (flush_batch)
            self._batch.append(task)
            return self.queued_label()
        row = OrmQ.objects.using(Conf.ORM).create(
            key=self.list_key or Conf.CLUSTER_NAME, payload=task, lock=self.timeout(None)
        )
        self._on_commit(lambda: self._fired.append((row.pk, task)))
        return row.pk

    def flush_batch(self, alias: str) -> None:
        """Insert the batch's tasks with one statement, already claimed like ``enqueue``'s."""
        if not self._batch:
            return
        key = self.list_key or Conf.CLUSTER_NAME
        lock = self.timeout(None)
        rows = OrmQ.objects.using(Conf.ORM).bulk_create(
            [OrmQ(key=key, payload=task, lock=lock) for task in self._batch]
        )
        fired = [(row.pk, row.payload) for row in rows]
        self._on_commit(lambda: self._fired.extend(fired))

    def claim_fired(self) -> list[tuple[Any, Any]]:
        fired, self._fired = self._fired, []
        return fired

    def ready_tasks(self) -> list[tuple[Any, Any]]:
        """The ORM broker's dequeue without its idle sleep."""
        queue = self.get_connection()
        now = timezone.now()
        rows = list(queue.filter(key=self.list_key, lock__lt=now)[: Conf.BULK])
        return [
            (row.pk, row.payload)
            for row in rows
            if queue.filter(pk=row.pk, lock=row.lock).update(lock=self.timeout(row))
        ]


# Note [SIGTERM to the group]
#     django-q2's qcluster is a leader process (its SIGTERM handler stops the cluster), a
#     sentinel, and the sentinel's pusher, monitor and workers. The sentinel and its children
#     ignore SIGINT, so Ctrl-C reaches the leader alone; but they leave SIGTERM at its default.
#     When SIGTERM reaches every process at once (systemd's KillMode=control-group, `kill --
#     -PGID`, `timeout`, some container runtimes) they all die: the sentinel inside
#     stop_event.wait(), so the leader's stop_event.set() waits forever for the dead waiter's
#     acknowledgement, or, when only the workers die, the pusher blocks on the full task queue
#     nobody drains. Either way the cluster hangs in "stopping". So SIGTERM is made to mean what
#     it means to the leader: stop in order. The sentinel ignores it (set in AlarmBroker.ping(),
#     the first thing the sentinel does, before it forks its children); the pusher and monitor
#     inherit that and are stopped by the sentinel as usual; each worker ignores it unless its
#     timer says the sentinel is killing it for overrunning ``timeout`` (that kill is a SIGTERM
#     too), and finishes its task, then takes the sentinel's STOP. A worker's timer is the
#     ``timer`` local of django-q2's worker(), found on the stack when post_spawn fires: -1 idle,
#     the task's timeout (plus 3 s) while busy, 0 once the sentinel has counted it down.


def _in_sentinel() -> bool:
    """Whether this is a child process of a qcluster (its sentinel, when ping() runs)."""
    return multiprocessing.parent_process() is not None


def _sentinel_on_stack() -> Any:
    """The django-q2 ``Sentinel`` whose status is being saved (Note [A stopping cluster
    waits]), found on the stack as ``_worker_timer`` finds a worker's timer, or None."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if all(hasattr(candidate, a) for a in ("pool", "stop_event", "start_event", "pusher")):
            return candidate
        frame = frame.f_back
    return None


def _worker_timer() -> Any:
    """The ``timer`` Value of the django-q2 worker() running this post_spawn, or None."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "worker" and "timer" in frame.f_locals:
            return frame.f_locals["timer"]
        frame = frame.f_back
    return None


def _worker_sigterm(sender: Any, **kwargs: Any) -> None:
    if not _in_sentinel():
        return
    timer = _worker_timer()
    if timer is None:  # an unknown django-q2: keep its default, die on SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if timer.value == 0:  # the sentinel's timeout kill
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        # Otherwise SIGTERM reached the whole cluster: finish the task, then take the STOP.

    signal.signal(signal.SIGTERM, on_sigterm)


post_spawn.connect(_worker_sigterm, dispatch_uid="durable_agent.broker.worker_sigterm")
