"""The overview's "finished" chart counts what the store holds: tasks that ended before
the dashboard started, and by any node, on SQLite and on Postgres, with its axes drawn
from those counts."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus
from chongming_task.stores.protocol import TaskStore
from tests.integration.postgres_support import made_schema, pg_dsn, schemas  # noqa: F401
from tests.integration.test_web import Web

pytest.importorskip("starlette", reason="the [web] extra is not installed")

S = TaskStatus


def _fill(store: TaskStore) -> None:
    """38 tasks that ended in the last ten minutes (30 succeeded at one moment, 8 failed
    at another), 5 that ended 20 minutes ago and 2 still running: none run by the
    dashboard's time."""
    now = datetime.now(UTC)
    rows = (
        [(S.SUCCEEDED, now - timedelta(seconds=95))] * 30
        + [(S.FAILED, now - timedelta(seconds=305))] * 8
        + [(S.SUCCEEDED, now - timedelta(minutes=20))] * 5
        + [(S.RUNNING, None)] * 2
    )
    for i, (status, ended) in enumerate(rows):
        store.create(
            TaskSnapshot(
                task_id=f"t{i:03d}",
                name="job",
                status=status,
                status_version=3,
                created_at=now - timedelta(minutes=30),
                started_at=now - timedelta(minutes=30),
                ended_at=ended,
            )
        )


@pytest.fixture(params=["sqlite", "postgres"])
def dashboard(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    schemas: list[str],  # noqa: F811
) -> Iterator[Web]:
    if request.param == "sqlite":
        db = tmp_path / "chart.db"
        store: TaskStore = SqliteTaskStore(db)
        target, args = str(db), ()
    else:
        from chongming_task.stores.postgres import PostgresTaskStore

        dsn = request.getfixturevalue("pg_dsn")
        schemas.append(made_schema(dsn))
        store = PostgresTaskStore(dsn, schema=schemas[-1])
        target, args = dsn, ("--pg-schema", schemas[-1])
    try:
        _fill(store)
    finally:
        store.close()
    web = Web(target, *args)
    try:
        yield web
    finally:
        web.close()


def test_the_finished_chart_counts_the_store_with_its_axes(dashboard: Web) -> None:
    status, page = dashboard.get("/")
    assert status == 200
    total = re.search(r'id="finished-total">([^<]*)<', page)
    assert total is not None and total.group(1).startswith("38 (0.06/s)"), total
    tallest = re.search(r'id="finished-tallest">(\d+)<', page)
    assert tallest is not None and tallest.group(1) == "30"
    chart = page[page.index('<svg class="chart"') : page.index("</svg>")]
    titles = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", chart)]
    assert len(titles) == 60
    said = [t.split(": ", 1)[1] for t in titles]
    assert said.count("30 succeeded") == 1 and said.count("8 failed") == 1
    assert said.count("none") == 58
    # The older bar stands to the left, about 30 bars before the newer one.
    assert 20 <= said.index("30 succeeded") - said.index("8 failed") <= 22
    for label in ("-10 min", "-5 min", "now"):
        assert f">{label}</text>" in chart
