"""The data model of docs/design/vocabulary.md, one module per concept under the app label "recovery" (`approvals`
holds what every four-eyes request shares). Every model and its choices are re-exported here: import them from
`recovery.models`. Only `recovery.statemachine.transitions` writes a call's `state` and `version`.
"""

from __future__ import annotations

from recovery.models.approvals import FourEyesRequest
from recovery.models.audit import ActorKind, AuditChainHead, AuditEvent
from recovery.models.breakers import (
    Breaker,
    BreakerBucket,
    BreakerOperation,
    BreakerOperationKind,
    BreakerOperationStatus,
    BreakerState,
    StatusBreaker,
)
from recovery.models.calls import Attempt, Call, Decision, Diagnostic, GateDecision, Receipt, ReceiptSource
from recovery.models.compensation import CompensationAttempt, CompensationEntry, CompensationReceipt
from recovery.models.drills import DrillRun
from recovery.models.mcp import IdentitySource, McpCall
from recovery.models.metrics import MetricCallMark, MetricFold, MetricRollup, MetricTotal
from recovery.models.notifications import (
    Assignment,
    ChannelKind,
    DeliveryAttempt,
    DeliveryItem,
    DeliveryStatus,
    EventKind,
    NotificationChannel,
    NotificationDelivery,
    NotificationEvent,
    NotificationRule,
    SavedView,
)
from recovery.models.observed import ObservedSpan, ObservedTally, ObservedTool, SpanOutcome
from recovery.models.probes import DuplicateProbe, ProbeDecision
from recovery.models.registry import Provider, RetryPath, Risk, SideEffect, Tenant, Tool
from recovery.models.reviews import ActionRequest, ActionStatus, BulkAction, BulkItem, BulkItemStatus, BulkStatus
from recovery.models.tasks import Step, Task, TaskOutcome, TaskStatus
from recovery.models.tokens import ApiToken, TokenScope

__all__ = [
    "ActionRequest",
    "ActionStatus",
    "ActorKind",
    "ApiToken",
    "Assignment",
    "Attempt",
    "AuditChainHead",
    "AuditEvent",
    "Breaker",
    "BreakerBucket",
    "BreakerOperation",
    "BreakerOperationKind",
    "BreakerOperationStatus",
    "BreakerState",
    "BulkAction",
    "BulkItem",
    "BulkItemStatus",
    "BulkStatus",
    "Call",
    "ChannelKind",
    "CompensationAttempt",
    "CompensationEntry",
    "CompensationReceipt",
    "Decision",
    "DeliveryAttempt",
    "DeliveryItem",
    "DeliveryStatus",
    "Diagnostic",
    "DrillRun",
    "DuplicateProbe",
    "EventKind",
    "FourEyesRequest",
    "GateDecision",
    "IdentitySource",
    "McpCall",
    "MetricCallMark",
    "MetricFold",
    "MetricRollup",
    "MetricTotal",
    "NotificationChannel",
    "NotificationDelivery",
    "NotificationEvent",
    "NotificationRule",
    "ObservedSpan",
    "ObservedTally",
    "ObservedTool",
    "ProbeDecision",
    "Provider",
    "Receipt",
    "ReceiptSource",
    "RetryPath",
    "Risk",
    "SavedView",
    "SideEffect",
    "SpanOutcome",
    "StatusBreaker",
    "Step",
    "Task",
    "TaskOutcome",
    "TaskStatus",
    "Tenant",
    "TokenScope",
    "Tool",
]
