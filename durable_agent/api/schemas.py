"""Request and response schemas of the HTTP API (``durable_agent.api``).

Every schema lists its fields explicitly; none is derived from a model, so a new model field
never leaks into the API by accident. Strings the API stores are free of NUL characters
(PostgreSQL text cannot hold them) and of lone surrogates (pydantic refuses them in a ``str``).
Datetimes in requests must carry a UTC offset.

Request bodies are JSON objects (:class:`ObjectIn`), never an array, a string or ``null``, and
their booleans are JSON ``true`` or ``false``; query booleans are ``true`` or ``false``.

Size: one explicit schema per body; a flat list of declarations.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    StrictBool,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from durable_agent.maintenance.lane_ids import MAX_LANE_ID_LENGTH
from durable_agent.models.ledger import (
    MAX_AGENT_NAME_LENGTH,
    MAX_AGENT_VERSION_LENGTH,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_THREAD_KEY_LENGTH,
)
from durable_agent.text import MAX_REASON_LENGTH

NO_NUL = r"^[^\x00]*$"
HOST_KEY = r"^[-a-zA-Z0-9_]+$"
LANE_ID = r"^[A-Za-z0-9_.:-]+$"
MAX_HOST_KEY_LENGTH = 200
MAX_PAGE_SIZE = 500
MAX_ID = 2**63 - 1


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("The datetime is out of range once converted to UTC") from exc


def _query_bool(value: object) -> object:
    """Only ``true`` and ``false`` (pydantic would also read ``yes``, ``on``, ``1``, ...)."""
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise ValueError("Input should be true or false")


def _datetime_text(value: object) -> object:
    """Only an ISO 8601 string (or a ``datetime``): pydantic would also read a number as seconds
    since 1970, which the schema's ``format: date-time`` does not allow."""
    if isinstance(value, str | datetime):
        return value
    raise ValueError("Input should be an ISO 8601 date-time string with a time zone")


UtcDatetime = Annotated[AwareDatetime, BeforeValidator(_datetime_text), AfterValidator(_to_utc)]
QueryBool = Annotated[bool, BeforeValidator(_query_bool)]
HostKey = Annotated[str, Field(min_length=1, max_length=MAX_HOST_KEY_LENGTH, pattern=HOST_KEY)]
LaneId = Annotated[str, Field(min_length=1, max_length=MAX_LANE_ID_LENGTH, pattern=LANE_ID)]
ThreadKey = Annotated[str, Field(min_length=1, max_length=MAX_THREAD_KEY_LENGTH, pattern=NO_NUL)]
RowId = Annotated[int, Field(ge=1, le=MAX_ID)]
Cursor = Annotated[str, Field(min_length=1, max_length=100)]
Reason = Annotated[str, Field(max_length=MAX_REASON_LENGTH, pattern=NO_NUL)]
IdempotencyKey = Annotated[
    str, Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LENGTH, pattern=NO_NUL)
]
LaneStateName = Literal["idle", "pending", "parked"]
PassPhaseName = Literal["caught-up", "actionable", "busy", "failed", "stale"]
SubmissionStateName = Literal["ready", "running", "suspended", "unknown", "settled"]
OutcomeName = Literal["completed", "failed", "aborted"]


# -- errors ------------------------------------------------------------------------------


class ErrorOut(Schema):
    """Every error: a stable ``code`` (docs/api.md lists them), a message, and details."""

    code: str
    message: str
    detail: dict[str, Any]


# -- request bodies -----------------------------------------------------------------------


class ObjectIn(Schema):
    """A request body: a JSON object and nothing else.

    Ninja's ``Schema`` reads its fields as attributes of any object, so an array or a string
    would validate as a body whose fields all have defaults; this refuses them first.
    """

    @model_validator(mode="wrap")
    @classmethod
    def _an_object(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if not isinstance(data, (dict, cls)):
            raise ValueError(f"The body must be a JSON object, not {_json_type(data)}")
        return handler(data)


def _json_type(data: Any) -> str:
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, (int, float)):
        return "a number"
    if isinstance(data, str):
        return "a string"
    if isinstance(data, list):
        return "an array"
    return type(data).__name__


# -- pages and filters --------------------------------------------------------------------


class PageQuery(Schema):
    limit: int = Field(50, ge=1, le=MAX_PAGE_SIZE)
    offset: int = Field(0, ge=0, le=MAX_ID)


class HostFilterQuery(Schema):
    limit: int = Field(50, ge=1, le=MAX_PAGE_SIZE)
    cursor: Cursor | None = Field(
        None,
        description="The previous page's `next`: the page after it (keyset pagination). Only "
        "a `next` this endpoint issued is accepted (422 `invalid_cursor`).",
    )
    overdue: QueryBool | None = Field(None, description="Armed, and more than 60 s past its time.")
    parked: QueryBool | None = Field(None, description="Has at least one parked lane.")
    faulted: QueryBool | None = Field(None, description="Has at least one recovery fault.")
    dirty: QueryBool | None = Field(None, description="Has an unacknowledged generation.")
    failing: QueryBool | None = Field(
        None, description="Its last FAILING_AFTER_PASSES passes failed (busy ones not counted)."
    )


class SubmissionFilterQuery(Schema):
    host: HostKey | None = Field(None, description="Only this host's submissions.")
    thread: ThreadKey | None = Field(None, description="Only threads with this key.")
    state: SubmissionStateName | None = Field(None, description="Only submissions in this state.")
    agent: str | None = Field(
        None, min_length=1, max_length=200, pattern=NO_NUL, description="Only this agent."
    )
    limit: int = Field(50, ge=1, le=MAX_PAGE_SIZE)
    cursor: Cursor | None = Field(
        None,
        description="The previous page's `next`: the page after it (keyset pagination). Only "
        "a `next` this endpoint issued is accepted (422 `invalid_cursor`).",
    )


# -- hosts --------------------------------------------------------------------------------


class HostSummaryOut(Schema):
    key: str
    single_thread: bool
    created_at: datetime
    alarm: datetime | None = Field(description="The slot's time; null when disarmed.")
    overdue: bool
    failing: bool = Field(description="Its last FAILING_AFTER_PASSES passes failed.")
    failed_passes: int = Field(description="Failed passes since the last successful one.")
    dirty: int
    processed: int
    nonterminal: int
    parked_lanes: int
    faults: int
    binding_retries: int


class HostPageOut(Schema):
    items: list[HostSummaryOut] = Field(description="Oldest first (by id, ascending).")
    limit: int
    next: str | None = Field(
        description="Pass it as `cursor` for the next page; null on the last page."
    )


class MaintenanceOut(Schema):
    """The maintenance state row (a host without one reads dirty=1, processed=0)."""

    dirty: int
    processed: int
    nonterminal: int
    binding_registry_key: str | None
    retry_generation: int | None
    retry_not_before: datetime | None
    retry_stalls: int | None
    pass_lease_owner: str | None
    pass_lease_expires_at: datetime | None
    recovery_event_sequence: int
    recovery_event_acknowledged: int


class LaneOut(Schema):
    lane: str
    state: LaneStateName
    due_at: datetime | None
    not_before: datetime | None
    stalls: int
    revision: int
    progress_key: str | None
    reported: bool


class BindingRetryOut(Schema):
    id: int
    thread: str
    submission: str
    attempts: int
    reported_at: datetime
    registry_key: str


class FaultOut(Schema):
    thread: str
    first_failed_at: datetime
    last_failed_at: datetime
    retry_at: datetime
    attempts: int
    failure: dict[str, Any]


class PassRecordOut(Schema):
    id: int
    started_at: datetime
    finished_at: datetime | None
    phase: PassPhaseName
    recovered: int
    settled: int
    alarm: str
    generation: int | None
    error: str
    deadline: datetime | None
    lateness_ms: int | None


class InvariantOut(Schema):
    ok: bool
    violations: list[str]


class HostDetailOut(Schema):
    key: str
    single_thread: bool
    created_at: datetime
    alarm: datetime | None
    overdue: bool
    failing: bool = Field(description="Its last FAILING_AFTER_PASSES passes failed.")
    failed_passes: int = Field(description="Failed passes since the last successful one.")
    last_error: str = Field(description="The error of the latest failed pass ('' if none).")
    state: MaintenanceOut
    invariant: InvariantOut
    lanes: list[LaneOut]
    binding_retries: list[BindingRetryOut]
    faults: list[FaultOut]
    recent_passes: list[PassRecordOut]


class AuditOut(Schema):
    id: int
    action: str
    actor: str
    reason: str
    old_deadline: datetime | None
    new_deadline: datetime | None
    generation: int
    detail: dict[str, Any]
    at: datetime


class AuditPageOut(Schema):
    count: int
    limit: int
    offset: int
    items: list[AuditOut]


# -- health -------------------------------------------------------------------------------


class HostAuditOut(Schema):
    host: str
    ok: bool
    dirty: int
    processed: int
    slot: datetime | None
    earliest_due: datetime | None
    violations: list[str]
    overdue: bool
    parked_lanes: list[str]
    expired_tickets: int
    stale_lease: bool
    stale_binding_retries: int
    failing: bool = Field(description="The last FAILING_AFTER_PASSES passes failed.")
    failed_passes: int = Field(description="Failed passes since the last successful one.")
    last_error: str = Field(description="The error of the latest failed pass ('' if none).")


class FailingHostOut(Schema):
    host: str
    failed_passes: int = Field(description="Failed passes since the last successful one.")
    error: str = Field(description="The error of the latest failed pass.")


class HealthCountsOut(Schema):
    violating: int = Field(description="Hosts violating the alarm invariant.")
    failing: int = Field(description="Failing hosts.")
    overdue: int = Field(description="Overdue hosts.")
    parked_hosts: int = Field(description="Hosts with at least one parked lane.")
    parked_lanes: int = Field(description="Parked lanes, across hosts.")
    stale_leases: int = Field(description="Hosts whose pass lease expired unreleased.")


class AttentionOut(Schema):
    """Work that waits for a person, across hosts."""

    unknown: int = Field(description="Submissions whose side effect's outcome is unknown.")
    suspended: int = Field(description="Submissions waiting for approval.")
    binding_waits: int = Field(description="Heads parked on a missing agent binding.")
    failing_hosts: int
    total: int


class HealthOut(Schema):
    ok: bool = Field(description="No host violates the alarm invariant and none is failing.")
    hosts: int
    counts: HealthCountsOut = Field(description="The whole length of every list below.")
    listed: int = Field(
        description="The most hosts each list holds (the first ones by id), and the most lanes "
        "per host in `parked`; `counts` says how many there are."
    )
    violating: list[HostAuditOut]
    failing: list[FailingHostOut] = Field(
        description="Hosts whose last FAILING_AFTER_PASSES passes failed (busy ones not counted)."
    )
    overdue: list[str]
    parked: dict[str, list[str]]
    expired_tickets: int
    stale_leases: list[str]
    degraded: bool = Field(
        description="Work waits for a person (see `attention`); not a failure of the alarms."
    )
    attention: AttentionOut


# -- repairs ------------------------------------------------------------------------------


class RearmIn(ObjectIn):
    at: UtcDatetime | None = Field(
        None, description="An explicit time; omit it to recompute the slot from the lanes."
    )
    reason: Reason = Field(min_length=1, description="Why; kept in the audit row.")


class RepairIn(ObjectIn):
    reason: Reason = Field("", description="Why; kept in the audit row.")


class RearmOut(Schema):
    host: str
    alarm: datetime | None = Field(description="The slot afterwards; null when disarmed.")


class RepairOut(Schema):
    host: str
    action: str
    audit_id: int
    alarm: datetime | None


class PassReportOut(Schema):
    host: str
    phase: PassPhaseName
    recovered: int
    settled: int
    nonterminal: int
    alarm: Literal["rearmed", "cleared", ""]
    generation: int | None
    lateness_ms: int | None


# -- submissions --------------------------------------------------------------------------


class SubmitIn(ObjectIn):
    agent: str = Field(min_length=1, max_length=MAX_AGENT_NAME_LENGTH, pattern=NO_NUL)
    version: str | None = Field(
        None, min_length=1, max_length=MAX_AGENT_VERSION_LENGTH, pattern=NO_NUL
    )
    payload: Any = Field(None, description="Any JSON value (at most 256 KiB encoded).")
    idempotency_key: IdempotencyKey | None = Field(
        None, description="Or the Idempotency-Key header; replaying it returns the receipt."
    )
    not_before: UtcDatetime | None = Field(
        None,
        description="Delay the start to this time (with a time zone; at most 366 days ahead). "
        "The submissions behind it on its thread wait with it.",
    )


class ReceiptOut(Schema):
    submission_id: int
    thread: str
    sequence: int
    idempotency_key: str
    created: bool
    state: SubmissionStateName


class SubmissionSummaryOut(Schema):
    id: int
    host: str
    thread: str
    sequence: int
    agent: str
    agent_version: str
    idempotency_key: str
    state: SubmissionStateName
    outcome: OutcomeName | None
    attempts: int
    not_before: datetime | None = Field(
        description="The agent does not start before this time: a delayed submission, or the "
        "next try of a retry (the last try's error is in `error` meanwhile)."
    )
    abort_requested_at: datetime | None
    approval_reason: str | None
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None


class SubmissionOut(SubmissionSummaryOut):
    """A summary with the payload, result, error and lease."""

    payload: Any
    result: Any
    error: Any
    approved_at: datetime | None
    lease_expires_at: datetime | None


MAX_WAIT_SECONDS = 30
"""The longest ``GET submissions/{id}?wait=`` holds a request (docs/api.md)."""


class SubmissionWaitQuery(Schema):
    wait: float | None = Field(
        None,
        ge=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description="Hold the request up to this many seconds (at most 30) until the "
        "submission settles; it answers with the current state either way.",
    )


class SubmissionPageOut(Schema):
    items: list[SubmissionSummaryOut] = Field(description="Newest first (by id, descending).")
    limit: int
    next: str | None = Field(
        description="Pass it as `cursor` for the next page; null on the last page."
    )


class SubmissionStatusOut(Schema):
    submission_id: int
    thread: str
    sequence: int
    state: SubmissionStateName
    outcome: OutcomeName | None
    abort_requested: bool


class ApproveIn(ObjectIn):
    approved: StrictBool = Field(True, description="False rejects: the submission settles failed.")
    reason: Reason = Field("", description="Why; kept in the audit row.")


class ResolveIn(ObjectIn):
    outcome: Literal["completed", "failed", "retry"]
    reason: Reason = Field("", description="Why; kept in the audit row.")
