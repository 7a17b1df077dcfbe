"""One firing per slot under a real race: processes that define one schedule reach the
same slots at the same moment and create one task per slot between them, on SQLite
(3 processes, one file) and on PostgreSQL (6)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from chongming_task import TaskQuery
from chongming_task.schedules import slot_task_id
from chongming_task.stores import open_store
from tests.integration.postgres_support import made_schema, pg_dsn, schemas
from tests.integration.racers import race
from tests.integration.schedule_racer import SLOTS, START

__all__ = ["pg_dsn", "schemas"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]


def _race(where: str, schema: str, racers: int, folder: Path) -> list[dict[str, int]]:
    """``racers`` processes reaching the same ``SLOTS`` slots, all told to go at once."""
    argvs = [[where, schema, f"racer-{n}", str(folder)] for n in range(racers)]
    return race("tests.integration.schedule_racer", argvs, folder)


def _one_task_a_slot(got: list[dict[str, int]], where: str, schema: str | None) -> None:
    assert all(g["fired"] + g["taken"] == SLOTS for g in got), got
    assert sum(g["fired"] for g in got) == SLOTS, got
    store = open_store(where, schema=schema)
    try:
        fired = store.query(TaskQuery(tag="schedule:every-10s", limit=1000))
    finally:
        store.close()
    # Reached at 12:00:15, :25, ...: the slots are 12:00:10, :20, ... (counted from 1970).
    slots = [START + timedelta(seconds=10 * n - 5) for n in range(1, SLOTS + 1)]
    expected = sorted(slot_task_id("every-10s", slot) for slot in slots)
    assert sorted(s.task_id for s in fired) == expected


def test_three_processes_on_one_sqlite_file_fire_each_slot_once(tmp_path: Path) -> None:
    where = str(tmp_path / "race.db")
    open_store(where).close()  # made before the race
    _one_task_a_slot(_race(where, "", 3, tmp_path), where, None)


def test_six_processes_on_postgres_fire_each_slot_once(
    pg_dsn: str, schemas: list[str], tmp_path: Path
) -> None:
    schema = made_schema(pg_dsn)
    schemas.append(schema)
    _one_task_a_slot(_race(pg_dsn, schema, 6, tmp_path), pg_dsn, schema)
