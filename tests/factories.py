"""Fixtures that build the registry and calls the way later code will: calls start READY and move only through
transitions.py. `call_in_state` inserts a call directly in a given state, which the database allows (the trigger
guards changes, not inserts) and which the state-table tests need to start from every state."""

from __future__ import annotations

import itertools

import pytest

from recovery.audit.chain import Actor
from recovery.engine.canonical import canonical_json
from recovery.models import Call, Provider, Step, Task, Tenant, Tool

_counter = itertools.count(1)


@pytest.fixture
def actor() -> Actor:
    return Actor.system("tests")


@pytest.fixture
def registry(db):
    tenant = Tenant.objects.create(name="acme", sandbox=True, all_tools=True)
    provider = Provider.objects.create(name="payments", base_url="http://127.0.0.1:9/")
    refund = Tool.objects.create(name="refund.create", provider=provider, side_effect="write", risk="high")
    lookup = Tool.objects.create(name="order.lookup", provider=provider, side_effect="read")
    return {"tenant": tenant, "provider": provider, "refund": refund, "lookup": lookup}


@pytest.fixture
def task(registry):
    return Task.objects.create(tenant=registry["tenant"], external_id=f"task-{next(_counter)}", agent="demo", goal="g")


@pytest.fixture
def make_call(registry, task):
    def make(state: str = "READY", *, tool: Tool | None = None, on_task: Task | None = None, **fields) -> Call:
        tool = tool or registry["refund"]
        owner = on_task or task
        n = next(_counter)
        step, _ = Step.objects.get_or_create(task=owner, index=1)
        args = {"order": n, "amount_cents": 800}
        return Call.objects.create(
            tenant=owner.tenant,
            task=owner,
            step=step,
            tool=tool,
            idempotency_key=f"key-{n}",
            arguments=args,
            fingerprint=canonical_json([tool.name, args])[:64],
            side_effect=tool.side_effect,
            risk=tool.risk,
            state=state,
            **fields,
        )

    return make


@pytest.fixture
def rq_queue(settings):
    """django-rq's queue on a real Redis (a database of this run's own), emptied before and after: jobs enqueued
    by the code under test wait in it until the test runs a real RQ worker on it."""
    import redis

    from recovery.jobs import queueing
    from tests.conftest import missing_service
    from tests.isolation import extra_redis_database

    url = settings.REDIS_URL or extra_redis_database("rq-queue")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        missing_service(f"needs Redis at {url}: run with REDIS_URL=redis://host:6379/0")
    settings.REDIS_URL = url
    queue = queueing.get_queue()
    queue.empty()
    yield queue
    queue.empty()
