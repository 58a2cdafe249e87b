"""The ingest benchmark's proof that its bare baseline does the product's work (recovery/devtools/benchmarks/ingest.py,
docs/benchmarks.md "The ingest benchmark"): a single shot through the whole Django stack and through the bare
psycopg endpoint make the same statements, kind by kind and table by table. Run here, at once, so that a change of
the product's statements that the baseline does not follow fails the suite instead of `make bench`."""

from __future__ import annotations

import pytest

from recovery.devtools.benchmarks.ingest import TARGET_STATEMENTS, Fixture, _statements_checked, connection_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_bare_baseline_makes_the_statements_a_single_shot_makes():
    product, orm = _statements_checked(Fixture.create(), connection_url())
    assert len(product) <= TARGET_STATEMENTS
    assert len(orm) >= len(product)  # the ORM twin does the same work, in as many statements or more
