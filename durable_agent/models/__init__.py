"""durable_agent's models, re-exported by name."""

from durable_agent.models.audit import AlarmAudit, PassPhase, PassRecord
from durable_agent.models.host import Host, MaintenanceState
from durable_agent.models.lanes import DueLane, LaneState, MutationTicket
from durable_agent.models.ledger import (
    Submission,
    SubmissionOutcome,
    SubmissionState,
    Thread,
)
from durable_agent.models.recovery import (
    BindingRetry,
    RecoveryEvent,
    RecoveryFault,
    RecoveryTransition,
    WorkCursor,
)
from durable_agent.models.tokens import ApiToken as ApiToken

__all__ = [
    "AlarmAudit",
    "BindingRetry",
    "DueLane",
    "Host",
    "LaneState",
    "MaintenanceState",
    "MutationTicket",
    "PassPhase",
    "PassRecord",
    "RecoveryEvent",
    "RecoveryFault",
    "RecoveryTransition",
    "Submission",
    "SubmissionOutcome",
    "SubmissionState",
    "Thread",
    "WorkCursor",
]
