"""Reads of bulk actions (docs/bulk.md): one bulk's page — the bulk, every frozen item with its call, the counts. The
bulks waiting for a second person are read with every other kind's (recovery.selectors.approvals)."""

from __future__ import annotations

from dataclasses import dataclass

from recovery.models import BulkAction, BulkItem

# What the page shows of an item and its call (a 500-item page reads no more).
_ITEM_FIELDS = (
    "position", "call_version", "call_state", "status", "checks", "why", "request_id", "call__id", "call__state",
    "call__version", "call__idempotency_key", "call__tool__name", "call__task__external_id",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BulkPage:
    bulk: BulkAction
    items: list[BulkItem]
    counts: dict[str, int]


def bulk_page(bulk_id: int) -> BulkPage | None:
    """The bulk with its people, its items in order with their calls' tool, task and current state; None if none.
    Two statements whatever the bulk's size (at most 500 items)."""
    bulk = BulkAction.objects.select_related("previewed_by", "requested_by", "decided_by").filter(pk=bulk_id).first()
    if bulk is None:
        return None
    items = list(
        BulkItem.objects.filter(bulk_id=bulk.pk)
        .select_related("call__tool", "call__task")
        .only(*_ITEM_FIELDS)
        .order_by("position")
    )
    counts: dict[str, int] = {}
    for item in items:
        counts[item.status] = counts.get(item.status, 0) + 1
    return BulkPage(bulk=bulk, items=items, counts=counts)
