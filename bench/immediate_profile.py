"""``python -m bench.immediate --profile N``: where the time of one fresh submission goes.

``N`` trivial submissions (``bench-immediate``, a caught-up host each, 0.5 s apart so that no
two passes overlap) run on a cluster traced by ``bench/trace.py``. For each submission the
pass whose ``fire_alarm`` or ``prompt_pass`` span (an alarm delivery, or a prompt start: Note
[Prompt start]) holds the agent's first line is its pass; later passes of the
same host are its follow-up passes. Printed: the stages from ``submit()`` returning to the
agent's first line (median over the passes), the spans inside the pass, the pass's
statements, commits, health checks and thread-pool hand-offs, the statements of each alarm
transaction, the follow-up passes, the client's ``submit()``, and the median pass line by line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import reset, table
from bench.immediate import Outcome, call_counted, cluster_errors, make_hosts, read_stamps

# (label, from mark, to mark): consecutive stages of the path to the agent's first line.
STAGES = [
    ("commit -> the prompt hint reaches the pusher", "returned", "hinted"),
    ("hint -> dequeue returns the prompt task (no firing)", "hinted", "dequeued"),
    ("commit -> notification reaches the pusher", "returned", "notified"),
    ("notification -> firing starts (deadline - FIRE_AHEAD_MS)", "notified", "firing"),
    ("firing transaction (fire_alarm_batch)", "firing", "fired"),
    ("firing commit -> dequeue returns the task", "fired", "dequeued"),
    ("pusher -> worker starts the task (queue, unpickle)", "dequeued", "task"),
    ("hold_until: the worker waits for the deadline (an alarm delivery)", "task", "held"),
    ("begin transaction (health check, lease, generation, lanes)", "held", "begun"),
    ("heartbeat thread start, admit waves, barrier", "begun", "native"),
    ("native observe (scan, discovery, faults, binding waits)", "native", "observed"),
    ("native select (no transaction)", "observed", "selected"),
    ("dispatch: the attempt starts (inline, or a pool hand-off)", "selected", "attempt"),
    ("recover_thread (cursor read, run_recovery on the runner)", "attempt", "recovered"),
    ("head_of, lease claim transaction, lease keeper start", "recovered", "called"),
    ("run_as_producer -> the agent's first line", "called", "agent"),
]
AFTER = [
    ("the agent's first line -> settle transaction ends", "agent", "settled"),
    ("settled -> the pass ends (checkpoint, waves, finish, record)", "settled", "ended"),
]
TOTAL = "total: submit() returned -> the agent's first line"
TASK_SPANS = ("tasks.fire_alarm ", "tasks.prompt_pass ")  # the pass of a delivery
COUNTED = ("sql", "commit", "rollback", "health", "connect", "handoff")


@dataclass
class Pass:
    """One traced pass that ran a submission's agent."""

    submission: int
    fire: Any
    inside: list[Any]
    marks: dict[str, float]
    followups: list[Any] = field(default_factory=list)
    batch: Any = None  # the pusher's fire_alarm_batch span that fired its slot (alarm only)

    @property
    def latency(self) -> float:
        return (self.marks["agent"] - self.marks["returned"]) * 1000


def run_profile(args: argparse.Namespace) -> None:
    import durable_agent
    from bench import trace
    from bench.burst import py_spy
    from durable_agent.models import Submission

    reset()
    traces = tempfile.mkdtemp(prefix="bench-trace-")
    stamps = tempfile.mkdtemp(prefix="bench-immediate-")
    hosts = make_hosts("prof", args.profile)
    os.environ["BENCH_TRACE_DIR"] = traces
    trace.install()  # the client too: submit()'s statements
    from django.db import connection

    connection.close()  # reconnect: the statement wrapper attaches to the new connection
    returned: dict[int, float] = {}
    by_host: dict[int, int] = {}
    env = {"BENCH_HANDLER_DIR": stamps, "BENCH_TRACE_DIR": traces, "Q_WORKERS": str(args.workers)}
    from bench.common import cluster

    outcome = Outcome()
    client_start = time.time()
    try:
        with cluster(workers=args.workers, env=env) as process:
            time.sleep(4)
            spy = py_spy(process.pid, args.py_spy) if args.py_spy else None
            client_start = time.time()
            for host in hosts:
                done = call_counted(
                    outcome,
                    lambda host=host: (
                        durable_agent.submit(
                            host=host, thread="t", agent="bench-immediate", payload={}
                        ),
                        time.time(),
                    ),
                )
                if done is not None:
                    returned[done[0].submission_id] = done[1]
                    by_host[host] = done[0].submission_id
                time.sleep(0.5)
            time.sleep(1.0)
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                spy.wait(timeout=60)
    except SystemExit as exc:
        cluster_errors(outcome, exc)
    finally:
        os.environ.pop("BENCH_TRACE_DIR", None)
    inline = inline_passes(hosts=8, stamps=stamps)
    lines = trace.load(traces)
    states = Submission.objects.filter(pk__in=returned).values_list("state", flat=True)
    outcome.errors["not settled"] += sum(1 for state in states if state != "settled")
    passes = attribute(lines, returned, by_host, read_stamps(stamps, "agent"))
    outcome.errors["no traced pass"] += len(returned) - len(passes)
    report(lines, passes, client_start)
    table(
        "Profile: the same pass run inline by the client, no cluster (run_pass; medians)",
        ["what", "median ms", "max ms"],
        inline,
    )
    errors = {k: n for k, n in outcome.errors.items() if n}
    print(f"profile errors: {errors or 0}")
    shutil.rmtree(traces, ignore_errors=True)
    shutil.rmtree(stamps, ignore_errors=True)


def _first(lines: list[Any], after: float, test: Callable[[Any], bool]) -> Any:
    return next((line for line in lines if line.start >= after and test(line)), None)


def attribute(
    lines: list[Any],
    returned: dict[int, float],
    by_host: dict[int, int],
    starts: dict[str, list[tuple[str, float]]],
) -> list[Pass]:
    """Each submission's pass (the fire_alarm or prompt_pass span holding its agent's first
    line), its marks along the path, and the later passes of its host."""
    fires: dict[int, list[Any]] = defaultdict(list)
    for line in lines:
        if line.kind == "span" and line.name.startswith(TASK_SPANS):
            fires[int(line.name.split()[1])].append(line)
    passes = []
    for host, submission in by_host.items():
        agent = [t for what, t in starts.get(str(submission), []) if what == "start"]
        pass_line = next((f for f in fires[host] if agent and f.start <= min(agent) <= f.end), None)
        if pass_line is None:
            continue
        inside = [  # every thread of the worker: no other pass runs in it meanwhile
            line
            for line in lines
            if line.pid == pass_line.pid
            and pass_line.start <= line.start
            and line.end <= pass_line.end + 1e-6
        ]
        marks, batch = path_marks(lines, inside, pass_line, returned[submission])
        marks["agent"] = min(agent)
        later = [f for f in fires[host] if f.start > pass_line.end]
        passes.append(Pass(submission, pass_line, inside, marks, later, batch))
    return passes


def path_marks(
    lines: list[Any], inside: list[Any], fire: Any, returned: float
) -> tuple[dict[str, float], Any]:
    marks = {"returned": returned, "task": fire.start, "ended": fire.end}
    if fire.name.startswith("tasks.prompt_pass "):  # no slot fired: the hint, the dequeue
        hint = _first(
            lines,
            returned - 0.01,
            lambda ln: ln.kind == "event" and ln.name == f"hint {fire.name.split()[1]}",
        )
        if hint is not None:
            marks["hinted"] = hint.start
            dequeued = _first(lines, hint.start, lambda ln: ln.name.startswith("dequeue "))
            if dequeued is not None and dequeued.start <= fire.start:
                marks["dequeued"] = dequeued.start
        _pass_marks(inside, fire, marks)
        return marks, None
    deadline = float(fire.name.split()[2])
    notify = _first(
        lines,
        returned - 0.01,
        lambda ln: (
            ln.kind == "event"
            and ln.name.startswith("notify ")
            and ln.name != "notify reconnect"
            and abs(float(ln.name.split()[1]) - deadline) < 0.002
        ),
    )
    after = returned if notify is None else notify.start
    batch = _first(
        lines,
        after,
        lambda ln: ln.name == "AlarmFiring.fire_alarm_batch" and ln.end <= fire.start,
    )
    if notify is not None:
        marks["notified"] = notify.start
    if batch is not None:
        marks["firing"], marks["fired"] = batch.start, batch.end
        dequeued = _first(lines, batch.end, lambda ln: ln.name.startswith("dequeue "))
        if dequeued is not None:
            marks["dequeued"] = dequeued.start
    _pass_marks(inside, fire, marks)
    return marks, batch


def _pass_marks(inside: list[Any], fire: Any, marks: dict[str, float]) -> None:
    """The marks inside the pass. A prompt pass holds nothing (``held`` is its start), and a
    fresh head is not swept (``recovered`` is the attempt's start)."""
    for name, span, at_end in [
        ("held", "tasks.hold_until", True),
        ("begun", "run.begin", True),
        ("native", "native.run_native", False),
        ("observed", "native.observe", True),
        ("selected", "native.select", True),
        ("attempt", "native.attempt", False),
        ("recovered", "recovery.recover_thread", True),
        ("called", "attempts._call_agent", False),
        ("settled", "attempts._settle", True),
    ]:
        found = _first(inside, fire.start, lambda ln, span=span: ln.name == span)
        if found is not None:
            marks[name] = found.end if at_end else found.start
    marks.setdefault("held", fire.start)
    if "attempt" in marks:
        marks.setdefault("recovered", marks["attempt"])


def report(lines: list[Any], passes: list[Pass], client_start: float) -> None:
    med = statistics.median
    if not passes:
        print("profile: no traced pass ran an agent")
        return
    stages: dict[str, list[float]] = defaultdict(list)
    for p in passes:
        for label, a, b in STAGES + AFTER:
            if a in p.marks and b in p.marks:
                stages[label].append((p.marks[b] - p.marks[a]) * 1000)
        stages[TOTAL].append(p.latency)
    labels = [label for label, _, _ in STAGES + AFTER] + [TOTAL]
    table(
        f"Profile: one fresh submission, {len(passes)} passes (bench/trace.py; "
        "the machine was shared)",
        ["stage", "passes", "median ms", "max ms"],
        [[k, len(stages[k]), med(stages[k]), max(stages[k])] for k in labels if stages[k]],
    )
    spans: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, list[int]] = defaultdict(list)
    counts: dict[str, list[float]] = defaultdict(list)
    by_txn: dict[str, list[int]] = defaultdict(list)
    for p in passes:
        durations: dict[str, float] = defaultdict(float)
        seen: Counter[str] = Counter()
        for line in p.inside:
            if line.kind == "span":
                name = line.name.split()[0] if line.name.startswith(TASK_SPANS) else line.name
                durations[name] += line.ms
                seen[name] += 1
        for name in durations:
            spans[name].append(durations[name])
            calls[name].append(seen[name])
        kinds = Counter(line.kind for line in p.inside)
        for kind in COUNTED:
            counts[kind].append(kinds[kind])
        counts["threads"].append(len({line.thread for line in p.inside}))
        before = [ln for ln in p.inside if ln.start < p.marks["agent"]]
        counts["round trips before the agent (sql + commit + health)"].append(
            sum(1 for ln in before if ln.kind in ("sql", "commit", "health"))
        )
        counts["commits before the agent"].append(sum(1 for ln in before if ln.kind == "commit"))
        start = p.marks.get("held", p.fire.start)
        waiting = sum(
            ln.ms for ln in before if ln.kind in ("sql", "commit", "health") and ln.start >= start
        )
        counts["ms in statements, pass start -> agent"].append(waiting)
        counts["ms elsewhere, pass start -> agent"].append(
            (p.marks["agent"] - start) * 1000 - waiting
        )
        counts["thread hand-offs before the agent (pool + runner)"].append(
            sum(1 for ln in before if ln.kind == "handoff" or ln.name == "pool.bounded_call")
        )
        counts["wall ms after hold_until"].append((p.fire.end - p.marks["held"]) * 1000)
        counts["follow-up passes"].append(len(p.followups))
        for txn in (ln for ln in p.inside if ln.kind == "span" and ln.name.startswith("txn ")):
            by_txn[txn.name[4:]].append(
                sum(
                    1
                    for ln in p.inside
                    if ln.kind == "sql"
                    and ln.thread == txn.thread
                    and txn.start <= ln.start <= txn.end
                )
            )
    table(
        "Profile: spans inside the pass (nested spans counted in each)",
        ["span", "calls per pass", "median ms per pass"],
        sorted(([k, med(calls[k]), med(v)] for k, v in spans.items()), key=lambda r: -float(r[2])),
    )
    table(
        "Profile: per pass ('sql' excludes BEGIN and COMMIT)",
        ["what", "median", "min", "max"],
        [[k, med(v), min(v), max(v)] for k, v in counts.items()],
    )
    units: dict[str, list[float]] = defaultdict(list)
    for p in passes:
        for line in p.inside:
            if line.kind in ("sql", "commit", "health", "handoff"):
                units[line.kind].append(line.ms)
    table(
        "Profile: one unit inside the pass (every pass's lines pooled)",
        ["unit", "count", "median ms", "p90 ms"],
        [[kind, len(v), med(v), sorted(v)[int(len(v) * 0.9)]] for kind, v in sorted(units.items())],
    )
    table(
        "Profile: statements per alarm transaction of the pass",
        ["transaction", "per pass", "statements each (median)"],
        [[k, len(v) / len(passes), med(v)] for k, v in sorted(by_txn.items())],
    )
    report_firing(lines, passes)
    report_followups(lines, passes)
    report_client(lines, client_start)
    table(
        "Profile: unit costs measured by the client meanwhile (medians; the machine was shared)",
        ["operation", "median ms", "p90 ms"],
        calibrate(),
    )
    example = sorted(passes, key=lambda p: p.latency)[len(passes) // 2]
    origin = example.marks["returned"]
    print("### Profile: the median pass, line by line (ms after submit() returned)\n")
    print("```")
    for line in example.inside:
        if line.kind in ("span", "sql", "commit", "health", "handoff", "connect"):
            print(
                f"{(line.start - origin) * 1000:8.2f} {line.ms:7.2f} {line.thread[:20]:20} "
                f"{line.kind:7} {line.name}"
            )
    print("```\n")


def report_followups(lines: list[Any], passes: list[Pass]) -> None:
    followups = [(p, f) for p in passes for f in p.followups]
    if not followups:
        return
    sql = []
    for _, fire in followups:
        sql.append(
            sum(
                1
                for ln in lines
                if ln.pid == fire.pid and ln.kind == "sql" and fire.start <= ln.start <= fire.end
            )
        )
    gaps = [(f.start - p.fire.end) * 1000 for p, f in followups]
    table(
        "Profile: follow-up passes (the same host, after the pass that ran the agent)",
        ["what", "median", "max"],
        [
            ["follow-up passes per submission", len(followups) / len(passes), ""],
            ["statements each", statistics.median(sql), max(sql)],
            ["wall ms each", statistics.median(f.ms for _, f in followups), ""],
            ["start after the pass ended, ms", statistics.median(gaps), max(gaps)],
        ],
    )


def report_client(lines: list[Any], client_start: float) -> None:
    client = os.getpid()
    mine = [ln for ln in lines if ln.pid == client and ln.start >= client_start]
    submits = [ln for ln in mine if ln.name == "services.submit"]
    if not submits:
        return

    def within(kind: str, s: Any) -> int:
        return sum(1 for ln in mine if ln.kind == kind and s.start <= ln.start <= s.end)

    med = statistics.median
    table(
        "Profile: the client's submit()",
        ["what", "median"],
        [
            ["statements", med(within("sql", s) for s in submits)],
            ["commits", med(within("commit", s) for s in submits)],
            ["health checks", med(within("health", s) for s in submits)],
            ["wall ms", med(s.ms for s in submits)],
        ],
    )


def report_firing(lines: list[Any], passes: list[Pass]) -> None:
    """The pusher's firing transaction of each pass's slot: its statements and commits."""
    batches = [p.batch for p in passes if p.batch is not None]
    if not batches:
        return

    def within(kind: str, batch: Any) -> int:
        return sum(
            1
            for ln in lines
            if ln.pid == batch.pid
            and ln.thread == batch.thread
            and ln.kind == kind
            and batch.start <= ln.start <= batch.end
        )

    med = statistics.median
    table(
        "Profile: the firing transaction in the pusher (AlarmFiring.fire_alarm_batch)",
        ["what", "median"],
        [
            ["statements", med(within("sql", b) for b in batches)],
            ["commits", med(within("commit", b) for b in batches)],
            ["wall ms", med(b.ms for b in batches)],
        ],
    )


def calibrate(rounds: int = 300) -> list[list[Any]]:
    """What one unit of each cost the pass pays costs on this machine right now."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection, transaction

    from durable_agent.models import Host

    def timed(fn: Callable[[], Any]) -> list[float]:
        values = []
        for _ in range(rounds):
            started = time.perf_counter()
            fn()
            values.append((time.perf_counter() - started) * 1000)
        return values

    def in_transaction() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    host = Host.objects.values_list("pk", flat=True).first() or 0
    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()
    handoffs: list[float] = []

    def handoff() -> None:
        queued = time.perf_counter()
        started = pool.submit(time.perf_counter).result()
        handoffs.append((started - queued) * 1000)

    def thread() -> None:
        worker = threading.Thread(target=lambda: None)
        worker.start()
        worker.join()

    rows = [
        ["a round trip (SELECT 1, autocommit)", timed(select_one)],
        [
            "an ORM lookup by primary key (compile + round trip)",
            timed(lambda: Host.objects.filter(pk=host).first()),
        ],
        ["BEGIN + SELECT 1 + COMMIT (transaction.atomic)", timed(in_transaction)],
        ["thread-pool hand-off and result (submit -> result)", timed(handoff)],
        ["thread-pool hand-off alone (submit -> the work starts)", handoffs],
        ["threading.Thread start + join", timed(thread)],
    ]
    pool.shutdown()
    return [[name, statistics.median(v), sorted(v)[int(len(v) * 0.9)]] for name, v in rows]


def inline_passes(hosts: int, stamps: str) -> list[list[Any]]:
    """``run_pass`` of one fresh submission called directly (traced client, no broker, no
    worker): the pass's own cost to the agent's first line and in all."""
    import durable_agent
    from durable_agent.maintenance import run_pass

    os.environ["BENCH_HANDLER_DIR"] = stamps
    to_agent: list[float] = []
    whole: list[float] = []
    try:
        for host in make_hosts("inline", hosts):
            receipt = durable_agent.submit(
                host=host, thread="t", agent="bench-immediate", payload={}
            )
            started = time.time()
            run_pass(host)
            whole.append((time.time() - started) * 1000)
            stamp = [
                t for what, t in read_stamps(stamps, "agent").get(str(receipt.submission_id), [])
            ]
            if stamp:
                to_agent.append((min(stamp) - started) * 1000)
    finally:
        os.environ.pop("BENCH_HANDLER_DIR", None)
    return [
        ["run_pass start -> the agent's first line", statistics.median(to_agent), max(to_agent)],
        ["run_pass in all", statistics.median(whole), max(whole)],
    ]
