"""The `queue` benchmark: the UNKNOWN queue page at a million calls (loaded by queue_load), first and deep, against
a bare page making one raw SQL query and the Django admin's changelist of the same columns and filters. The pages,
the checks and the figures: docs/benchmarks.md ("The queue benchmark"); the targets: docs/design/quality-targets.md.
"""

from __future__ import annotations

import html
import re
import statistics
import time
from contextlib import nullcontext
from datetime import datetime
from urllib.parse import parse_qs, quote, urlsplit

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.test import Client, override_settings
from django.urls import path, reverse
from django.utils import timezone

from console import urls as console_urls
from recovery.devtools.benchmarks.queue_load import ADMIN, CALLS, UNKNOWN, UNKNOWN_PER_CALLS, VIEWER, load
from recovery.models import Call, Step, Task, Tenant, Tool
from recovery.selectors.queues import PAGE_SIZE, QUEUES

DEPTH = 9_000  # the deep page: the one after this many rows
ADMIN_PAGE = admin.ModelAdmin.list_per_page  # 100: the admin's default page size
WARM_UP = 5
TARGET_BARE = 2.0  # product / bare at most
TARGET_ADMIN = 10.0  # admin / product at least

# --- the pages -----------------------------------------------------------------------------------------------------

_QUEUE = QUEUES["unknown"]


def _bare_sql(after: bool) -> str:
    """One statement: per state of the queue, its first rows in `call_queue_idx` order (state, state_changed_at, id)
    after the cursor, merged and cut to a page, then joined for the page's rows only."""
    branch = (
        "(SELECT id, task_id, step_id, tool_id, tenant_id, claimed_by_id, risk, state, state_changed_at, checks_made, "
        f"last_receipt_status, last_receipt_at, claim_until, outcome, idempotency_key FROM {Call._meta.db_table} "
        "WHERE state = %s"
        f"{' AND (state_changed_at, id) > (%s, %s)' if after else ''} ORDER BY state_changed_at, id LIMIT {PAGE_SIZE})"
    )
    return (
        'SELECT c.id, k.id, k.external_id, s."index", t.name, n.name, c.risk, c.state, c.state_changed_at, '
        "c.checks_made, c.last_receipt_status, c.last_receipt_at, u.username, c.claim_until, c.outcome, "
        "c.idempotency_key "
        f"FROM ({' UNION ALL '.join([branch] * len(_QUEUE.states))} ORDER BY state_changed_at, id LIMIT {PAGE_SIZE}) c "
        f"JOIN {Task._meta.db_table} k ON k.id = c.task_id JOIN {Step._meta.db_table} s ON s.id = c.step_id "
        f"JOIN {Tool._meta.db_table} t ON t.id = c.tool_id JOIN {Tenant._meta.db_table} n ON n.id = c.tenant_id "
        f"LEFT JOIN {get_user_model()._meta.db_table} u ON u.id = c.claimed_by_id "
        "ORDER BY c.state_changed_at, c.id"
    )


BARE_SQL_FIRST, BARE_SQL_AFTER = _bare_sql(after=False), _bare_sql(after=True)
_BARE_STATES = [str(state) for state in _QUEUE.states]
BARE_COLUMNS = (
    "id", "task_id", "external_id", "step", "tool", "tenant", "risk", "state", "state_changed_at", "checks_made",
    "last_receipt_status", "last_receipt_at", "claimed_by", "claim_until", "outcome", "idempotency_key",
)  # fmt: skip
BARE_TEMPLATE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Unknown outcome</title></head>
<body><table><tr><th>Call</th><th>Why</th><th>Key</th><th>Step</th><th>Tool</th><th>Tenant</th><th>Risk</th><th>State</th><th>Age</th>
<th>Checks</th><th>Last receipt</th><th>Claimed by</th></tr>
{% for r in rows %}<tr data-id="{{ r.id }}"><td><a href="/calls/{{ r.id }}/">call {{ r.id }}</a>
{{ r.external_id }} #{{ r.task_id }}</td><td>{{ r.state }} {{ r.outcome }}</td><td>{{ r.idempotency_key }}</td>
<td>{{ r.step }}</td>
<td>{{ r.tool }}</td><td>{{ r.tenant }}</td><td>{{ r.risk }}</td><td>{{ r.state }}</td>
<td>{{ r.state_changed_at|timesince:now }}</td><td>{{ r.checks_made }}</td>
<td>{% if r.last_receipt_at %}{{ r.last_receipt_status }} {{ r.last_receipt_at|timesince:now }} ago
{% else %}none{% endif %}</td>
<td>{% if r.claimed_by and r.claim_until > now %}{{ r.claimed_by }}{% endif %}</td></tr>
{% endfor %}</table></body></html>
"""
_bare_template = None


def bare_page(request: HttpRequest) -> HttpResponse:
    """The bare page: one raw SQL query for the queue's 50 rows, a minimal template, nothing else."""
    global _bare_template
    if _bare_template is None:
        _bare_template = engines["django"].from_string(BARE_TEMPLATE)
    sql, params = BARE_SQL_FIRST, _BARE_STATES
    if raw := request.GET.get("after"):
        at, _, pk = raw.rpartition("~")
        position = (datetime.fromisoformat(at), int(pk))
        sql, params = BARE_SQL_AFTER, [value for state in params for value in (state, *position)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = [dict(zip(BARE_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
    return HttpResponse(_bare_template.render({"rows": rows, "now": timezone.now()}))


class BenchCallAdmin(admin.ModelAdmin):
    """The queue's columns and filters; every other option default (docs/design/quality-targets.md's baseline)."""

    list_display = (
        "task__external_id", "task__id", "step__index", "tool", "tenant", "risk", "state", "state_changed_at",
        "checks_made", "last_receipt_status", "last_receipt_at", "claimed_by",
    )  # fmt: skip
    list_filter = ("tool", "tenant", "state", "risk", "state_changed_at")


class BenchCallAdmin50(BenchCallAdmin):
    """The same, drawing the queue's page size of rows (reported beside the baseline, not a target)."""

    list_per_page = PAGE_SIZE


bench_admin = admin.AdminSite(name="bench_queue_admin")
bench_admin.register(Call, BenchCallAdmin)
bench_admin50 = admin.AdminSite(name="bench_queue_admin50")
bench_admin50.register(Call, BenchCallAdmin50)

# The URLs while the benchmark runs: the console's own, then the bare page and the benchmark's admin site.
urlpatterns = [
    *console_urls.urlpatterns,
    path("bench/queue/bare/", bare_page, name="bench-queue-bare"),
    path("bench/queue/admin/", bench_admin.urls),
    path("bench/queue/admin50/", bench_admin50.urls),
]


# --- measure -------------------------------------------------------------------------------------------------------


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def _get(client: Client, url: str) -> str:
    response = client.get(url, secure=True)
    if response.status_code != 200:
        raise AssertionError(f"GET {url}: {response.status_code}")
    return response.content.decode()


def _ids(pattern: str, page: str) -> list[int]:
    return [int(pk) for pk in re.findall(pattern, page)]


PRODUCT_IDS, BARE_IDS, ADMIN_IDS = r'data-id="(\d+)"', r'data-id="(\d+)"', r"/recovery/call/(\d+)/change/"


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _pages(depth: int) -> dict[str, tuple[Client, str]]:
    """The eight pages, each with its signed-in client; checks that each shows what it should."""
    User = get_user_model()
    product, admin_client = Client(), Client()
    product.force_login(User.objects.get(username=VIEWER))
    admin_client.force_login(User.objects.get(username=ADMIN))
    first = reverse("console:queue", kwargs={"slug": _QUEUE.slug})
    deep, cursor = _deep_page(product, first, depth)
    bare = reverse("bench-queue-bare")
    changelists = {
        name: (reverse(f"{site.name}:recovery_call_changelist") + f"?state__exact={UNKNOWN}", per_page)
        for name, site, per_page in (("admin", bench_admin, ADMIN_PAGE), ("admin50", bench_admin50, PAGE_SIZE))
    }
    pages = {
        "product_first": (product, first),
        "product_deep": (product, deep),
        # The same page read through the selector's ORM twin (RECOVERY_HOT_PATH_SQL off): docs/architecture.md keeps the
        # SQL only while the ORM's page misses the target.
        "product_orm_first": (product, first),
        "product_orm_deep": (product, deep),
        "bare_first": (product, bare),
        "bare_deep": (product, f"{bare}?after={quote(cursor)}"),
    }
    for name, (changelist, per_page) in changelists.items():
        pages[f"{name}_first"] = (admin_client, changelist)
        pages[f"{name}_deep"] = (admin_client, f"{changelist}&p={depth // per_page + 1}")
    pages.update(_call_pages(product))
    _check_rows(pages, changelists, depth)
    return pages


def _deep_page(product: Client, first: str, depth: int) -> tuple[str, str]:
    """The queue page after `depth` rows, reached through the page's own "Next page" links, and its cursor (checked
    to be the one after `depth` rows)."""
    deep = first
    for _ in range(depth // PAGE_SIZE):
        match = re.search(r'<a href="([^"]+)" rel="next">', _get(product, deep))
        if match is None:
            raise AssertionError(f"no next page after {deep}")
        deep = html.unescape(match[1])
    cursor = parse_qs(urlsplit(deep).query)["after"][0]
    expected = (
        Call.objects.filter(state__in=_QUEUE.states)
        .order_by("state_changed_at", "id")
        .values_list("state_changed_at", "id")[depth - 1]
    )
    if cursor != f"{expected[0].isoformat()}~{expected[1]}":
        raise AssertionError(f"the deep page's cursor {cursor} is not the one after {depth} rows: {expected}")
    return deep, cursor


def _call_pages(product: Client) -> dict[str, tuple[Client, str]]:
    """The call page (docs/design/quality-targets.md: statements constant in its attempts): the queue's call with the
    fewest attempts and the one with the most, among the first thousand by id; timed beside the queue pages, no
    baseline of its own."""
    sample = Call.objects.filter(state=UNKNOWN, pk__in=Call.objects.filter(state=UNKNOWN).order_by("pk")[:1000])
    counted = list(sample.annotate(n=Count("attempts")).order_by("n", "pk").values_list("pk", "n"))
    (few, few_n), (many, many_n) = counted[0], counted[-1]
    _CALL_ATTEMPTS.update(few=few_n, many=many_n)
    return {
        "call_few": (product, reverse("console:call", kwargs={"call_id": few})),
        "call_many": (product, reverse("console:call", kwargs={"call_id": many})),
    }


def _check_rows(pages: dict[str, tuple[Client, str]], changelists: dict[str, tuple[str, int]], depth: int) -> None:
    """The bare pages show the product's rows, first and deep; each admin page its rows at its offset."""
    for which in ("first", "deep"):
        shown = _ids(PRODUCT_IDS, _get(*pages[f"product_{which}"]))
        if len(shown) != PAGE_SIZE or _ids(BARE_IDS, _get(*pages[f"bare_{which}"])) != shown:
            raise AssertionError(f"the bare {which} page does not show the product's {len(shown)} rows")
        offset = 0 if which == "first" else depth
        for name, (_, per_page) in changelists.items():
            admin_rows = list(
                Call.objects.filter(state=UNKNOWN)
                .order_by("-pk")
                .values_list("pk", flat=True)[offset : offset + per_page]
            )
            if _ids(ADMIN_IDS, _get(*pages[f"{name}_{which}"])) != admin_rows:
                raise AssertionError(f"the {name} {which} page does not show its rows at offset {offset}")


_CALL_ATTEMPTS: dict[str, int] = {}  # the attempts of the two call pages measured


def _reading(page: str):
    """The product's page as served (the selector's SQL), or through its ORM twin for the `product_orm_` pages."""
    return override_settings(RECOVERY_HOT_PATH_SQL=False) if page.startswith("product_orm_") else nullcontext()


def measure(count: int, *, depth: int = DEPTH) -> dict:
    pages = _pages(depth)
    statements = {}
    for name, (client, url) in pages.items():
        counter = _Counter()
        with connection.execute_wrapper(counter), _reading(name):
            _get(client, url)
        statements[name] = counter.count
    for name, (client, url) in pages.items():
        with _reading(name):
            for _ in range(WARM_UP):
                _get(client, url)
    samples: dict[str, list[float]] = {name: [] for name in pages}
    order = list(pages)
    for n in range(count):
        for name in order if n % 2 == 0 else reversed(order):
            client, url = pages[name]
            with _reading(name):
                start = time.perf_counter()
                response = client.get(url, secure=True)
                samples[name].append(time.perf_counter() - start)
            if response.status_code != 200:
                raise AssertionError(f"GET {url}: {response.status_code}")
    result = {}
    for name, series in samples.items():
        result[f"{name}_median_ms"] = round(statistics.median(series) * 1000, 2)
        result[f"{name}_p95_ms"] = round(_percentile(series, 0.95) * 1000, 2)
    median = {name: statistics.median(series) for name, series in samples.items()}
    for which in ("first", "deep"):
        result[f"ratio_product_bare_{which}"] = round(median[f"product_{which}"] / median[f"bare_{which}"], 2)
        result[f"ratio_product_orm_bare_{which}"] = round(median[f"product_orm_{which}"] / median[f"bare_{which}"], 2)
        result[f"ratio_admin_product_{which}"] = round(median[f"admin_{which}"] / median[f"product_{which}"], 1)
        result[f"ratio_admin50_product_{which}"] = round(median[f"admin50_{which}"] / median[f"product_{which}"], 1)
    for name, number in statements.items():
        result[f"statements_{name}"] = number
    result["deep_url"] = pages["product_deep"][1]
    result["call_few_attempts"], result["call_many_attempts"] = _CALL_ATTEMPTS["few"], _CALL_ATTEMPTS["many"]
    return result


def bench_queue(count: int = 30, *, calls: int = CALLS, unknown: int | None = None, depth: int | None = None) -> dict:
    """Load, then measure `count` requests per page (docs/benchmarks.md). The deep page is the one after
    `depth` rows: DEPTH, or with fewer UNKNOWN calls than DEPTH + 50, the last full page's."""
    if connection.vendor != "postgresql":
        return {
            "benchmark": "queue",
            "skipped": "needs PostgreSQL (the queue target of docs/design/quality-targets.md is defined there, and the "
            "loader uses COPY), "
            f"this is {connection.vendor}: run with DATABASE_URL=postgres://user@host:5432/dbname",
        }
    unknown = calls // UNKNOWN_PER_CALLS if unknown is None else unknown
    step = ADMIN_PAGE  # a multiple of both page sizes, so every deep page starts at exactly `depth` rows
    if depth is None:
        depth = min(DEPTH, (unknown // step - 1) * step)
    if depth <= 0 or depth % step or depth + step > unknown:
        raise ValueError(f"depth must be a positive multiple of {step} with a full page after it in {unknown}")
    loaded = load(calls, unknown=unknown)
    hosts = [*settings.ALLOWED_HOSTS, "testserver"]
    with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=hosts):
        measured = measure(count, depth=depth)
    result = {
        "benchmark": "queue",
        "database": connection.vendor,
        **loaded,
        "page_size": PAGE_SIZE,
        "depth": depth,
        "requests_per_page": count,
        **measured,
        "target_product_bare_max": TARGET_BARE,
        "target_admin_product_min": TARGET_ADMIN,
    }
    result["statements_constant"] = (
        result["statements_product_first"] == result["statements_product_deep"]
        and result["statements_call_few"] == result["statements_call_many"]
    )
    # docs/architecture.md: the page's SQL (recovery/selectors/queues.py) stays only while its ORM twin misses the
    # target.
    result["orm_twin_meets_target"] = all(
        result[f"ratio_product_orm_bare_{w}"] <= TARGET_BARE for w in ("first", "deep")
    )
    result["meets_targets"] = result["statements_constant"] and all(
        result[f"ratio_product_bare_{w}"] <= TARGET_BARE and result[f"ratio_admin_product_{w}"] >= TARGET_ADMIN
        for w in ("first", "deep")
    )
    return result
