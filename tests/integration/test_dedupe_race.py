"""Dedupe keys under a real race: processes that submit the same key at the same moment
get one task between them, on SQLite (2 processes, one file) and on PostgreSQL (8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chongming_task.stores import open_store
from chongming_task.stores.postgres import PostgresTaskStore
from tests.integration.postgres_support import new_schema, pg_dsn, schemas
from tests.integration.racers import race
from tests.integration.test_cli import cli, cli_json

__all__ = ["pg_dsn", "schemas"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]


def _race(where: str, schema: str, racers: int, folder: Path) -> list[dict[str, str]]:
    """``racers`` processes submitting key ``race`` at one moment; what each got. The
    task they race for runs until every racer has its answer, so none can come after it
    ended, however loaded the machine."""
    argvs = [[where, schema, "race", f"racer-{n}", str(folder)] for n in range(racers)]
    return race(
        "tests.integration.dedupe_racer",
        argvs,
        folder,
        answered=(folder / "release").touch,
    )


def _one_task(got: list[dict[str, str]], where: str, schema: str | None) -> None:
    assert len({g["task_id"] for g in got}) == 1, got
    assert sum(g["mine"] == "TaskRun" for g in got) >= 1  # the creator holds it
    store = open_store(where, schema=schema)
    try:
        keyed = [s for s in store.query() if s.dedupe_key == "race"]
        assert [s.task_id for s in keyed] == [got[0]["task_id"]]
        assert keyed[0].status.value == "succeeded"
    finally:
        store.close()


def test_two_processes_on_one_sqlite_file_get_one_task(tmp_path: Path) -> None:
    where = str(tmp_path / "race.db")
    open_store(where).close()  # made before the race
    got = _race(where, "", 2, tmp_path)
    _one_task(got, where, None)


def test_eight_processes_on_postgres_get_one_task(
    pg_dsn: str, schemas: list[str], tmp_path: Path
) -> None:
    schema = new_schema()
    schemas.append(schema)
    made = PostgresTaskStore(pg_dsn, schema=schema)
    made.create_schema()
    made.close()
    got = _race(pg_dsn, schema, 8, tmp_path)
    _one_task(got, pg_dsn, schema)


def test_ps_finds_a_dedupe_key_and_show_names_every_option(tmp_path: Path) -> None:
    from chongming_task import CancellationToken, Controller, SqliteTaskStore

    db = tmp_path / "keys.db"
    with Controller(SqliteTaskStore(db), owner="keys") as node:

        @node.task(name="bill")
        def bill(token: CancellationToken, account: str) -> str:
            return account

        keyed = bill.configure(dedupe_key="acct-9", dedupe_window=3600, priority=2)
        first = keyed.submit("9")
        assert first.result(10) == "9"
        node.tasks["bill"].configure(dedupe_key="acct-10").submit("10").wait(10)
        node.tasks["bill"].submit("plain").wait(10)

    rows: Any = cli_json(db, "ps", "--all", "--dedupe-key", "acct-9")
    assert [r["task_id"] for r in rows] == [first.task_id]
    assert rows[0]["dedupe_key"] == "acct-9" and rows[0]["dedupe_window"] == 3600
    shown = cli(db, "show", first.task_id).stdout
    assert "dedupe key" in shown and "'acct-9' (kept 3600 s after a success)" in shown
    assert "priority" in shown and "2" in shown
