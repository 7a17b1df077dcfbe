"""What a dedupe key costs a submit at a million tasks: the query plans.

    uv run python bench/dedupe_plan.py [--tasks N] [--dsn DSN]

Fills a store (SQLite, and PostgreSQL with ``--dsn``) with ``--tasks`` finished tasks,
one in ten with a dedupe key, then prints the plan of each statement a deduplicated
submit runs and its time against a lookup by primary key in the same store (the
reference): the check of the key inside the create (SQLite: the write view trigger's
query, ``dedupe_held``; Postgres: the insert's check of successes that keep a key, and
the unique index on unfinished tasks' keys), and the holder lookup a duplicate runs
(``dedupe_holders``). Target: an index probe each, not a scan.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from chongming_task.stores.sql import load_named
from chongming_task.stores.sqlite import SqliteTaskStore

SQLITE_SQL = load_named("chongming_task.stores.sqlite")  # the statements the store runs

ENDED = "2026-01-01T00:00:00+00:00"


def _timed(run: object, times: int = 200) -> float:
    """Microseconds a call of ``run`` takes, the median of ``times``."""
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        taken.append(time.perf_counter() - started)
    taken.sort()
    return taken[len(taken) // 2] * 1e6


def sqlite_plan(tasks: int, tmp: Path) -> None:
    path = tmp / "plan.db"
    SqliteTaskStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO tasks (task_id, name, status, status_version, attempt, tags, created_at, "
        "ended_at, priority, dedupe_key, dedupe_window) VALUES (?, 'job', 'succeeded', 4, 1, "
        "'[]', ?, ?, 0, ?, ?)",
        (
            (f"t{i:09d}", ENDED, ENDED, f"k{i}" if i % 10 == 0 else None, 60.0 if i % 20 else None)
            for i in range(tasks)
        ),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    print(f"SQLite, {tasks:,} tasks ({tasks // 10:,} with a dedupe key):")
    for name, sql, params in (
        ("the create's check (dedupe_held)", SQLITE_SQL["dedupe_held"], ("k500", ENDED)),
        ("a duplicate's lookup (dedupe_holders)", SQLITE_SQL["dedupe_holders"], ("k500",)),
        ("reference: by task id", "SELECT status FROM tasks WHERE task_id = ?", ("t000000500",)),
    ):
        plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        took = _timed(lambda sql=sql, params=params: conn.execute(sql, params).fetchall())
        print(f"  {name:<40} {took:7.1f} us  {'; '.join(plan)}")
    conn.close()


def postgres_plan(tasks: int, dsn: str) -> None:
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore
    from chongming_task.stores.postgres.schema import statements_in

    schema = f"chongming_plan_{os.getpid()}"
    pg_sql = statements_in(load_named("chongming_task.stores.postgres"), schema)
    made = PostgresTaskStore(dsn, schema=schema)
    made.create_schema()
    made.close()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path = {schema}".encode())
            conn.execute(
                "INSERT INTO tasks (task_id, name, status, status_version, attempt, tags, "
                "created_at, ended_at, priority, dedupe_key, dedupe_window) "
                "SELECT 't' || lpad(i::text, 9, '0'), 'job', 'succeeded', 4, 1, '[]', "
                "%s::timestamptz, %s::timestamptz, 0, "
                "CASE WHEN i %% 10 = 0 THEN 'k' || i END, CASE WHEN i %% 20 <> 0 THEN 60 END "
                "FROM generate_series(0, %s - 1) AS i",
                [ENDED, ENDED, tasks],
            )
            conn.execute("ANALYZE tasks")
            window_check = (
                "SELECT FROM tasks t WHERE t.dedupe_key = %s AND t.status = 'succeeded' "
                "AND t.dedupe_window IS NOT NULL "
                "AND t.ended_at + t.dedupe_window * interval '1 second' > %s::timestamptz"
            )
            unfinished = (
                "SELECT FROM tasks WHERE dedupe_key = %s AND status NOT IN "
                "('succeeded', 'failed', 'stopped', 'cancelled', 'lost')"
            )
            by_id = "SELECT status FROM tasks WHERE task_id = %s"
            print(f"PostgreSQL, {tasks:,} tasks ({tasks // 10:,} with a dedupe key):")
            for name, sql, params in (
                ("the insert's window check", window_check, ["k500", ENDED]),
                ("the unique index's probe (as a query)", unfinished, ["k500"]),
                ("a duplicate's lookup (dedupe_holders)", pg_sql["dedupe_holders"], ["k500"]),
                ("reference: by task id", by_id, ["t000000500"]),
            ):
                plan = [r[0].strip() for r in conn.execute(f"EXPLAIN {sql}".encode(), params)]
                took = _timed(
                    lambda sql=sql, params=params: conn.execute(sql.encode(), params).fetchall()
                )
                print(f"  {name:<40} {took:7.1f} us  {plan[0]}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--dsn", default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chongming-plan-") as tmp:
        sqlite_plan(a.tasks, Path(tmp))
    if a.dsn:
        postgres_plan(a.tasks, a.dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
