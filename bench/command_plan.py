"""The command channel's statements at fleet scale: their PostgreSQL plans and times
with a million commands in the table, nearly all of them finished.

    uv run python bench/command_plan.py [--commands 1000000] [--open 200] [--dsn DSN]

Fills a fresh schema (dropped afterwards) with ``--commands`` commands, all but
``--open`` finished, for 50,000 tasks held by 100 nodes, then shows ``EXPLAIN ANALYZE``
of what a node runs against it: the claim's read of the open commands (all of them, and
one node's) and its lock, the beacon's pulse (its count of the
commands nobody holds), a task's pending commands, and retention's delete of a batch
of old finished commands (rolled back). The reference is a lookup of one command by its
primary key. Each must be an index probe, not a scan of the table.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from chongming_task.model import NodeRecord
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.stores.postgres.schema import statements_in
from chongming_task.stores.sql import load_named


def fill(conn: psycopg.Connection, schema: str, commands: int, open_: int) -> None:
    conn.execute(
        f"INSERT INTO {schema}.commands (command_id, task_id, action, issued_by, created_at, "
        "finished_at, outcome) "
        "SELECT 'c' || i, 't' || (i %% 50000), 'stop', 'bench', "
        "now() - make_interval(secs => %s - i), "
        "CASE WHEN i > %s THEN NULL ELSE now() - make_interval(secs => %s - i) END, "
        "CASE WHEN i > %s THEN NULL ELSE 'stopping' END "
        "FROM generate_series(1, %s) AS i",
        [commands, commands - open_, commands, commands - open_, commands],
    )
    conn.execute(
        f"INSERT INTO {schema}.tasks (task_id, name, status, status_version, attempt, tags, "
        "created_at, lease_owner) SELECT 't' || i, 'job', 'running', 3, 1, '[]', now(), "
        "'node-' || (i % 100) FROM generate_series(0, 49999) AS i"
    )
    conn.execute(f"ANALYZE {schema}.commands")
    conn.execute(f"ANALYZE {schema}.tasks")


def plan(conn: psycopg.Connection, sql: str, params: list[object]) -> tuple[list[str], float]:
    """The plan's lines and the best of three executions' time (ms), in a transaction
    rolled back (the delete deletes nothing for good)."""
    lines: list[str] = []
    best = float("inf")
    for _ in range(3):
        with conn.transaction(force_rollback=True):
            rows = conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}", params).fetchall()
        lines = [r[0] for r in rows]
        for line in lines:
            if line.startswith("Execution Time:"):
                best = min(best, float(line.split()[2]))
    return lines, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--commands", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=200)
    args = parser.parse_args()
    schema = f"chongming_cmdplan_{uuid.uuid4().hex[:8]}"
    store = PostgresTaskStore(args.dsn, schema=schema)
    store.create_schema()
    now = datetime.now(UTC)
    store.declare_node(
        NodeRecord(
            node="n",
            buckets=None,
            num_buckets=64,
            ttl_seconds=30,
            started_at=now,
            seen_at=now,
            host="bench",
            pid=1,
        )
    )
    store.close()
    sql = statements_in(load_named("chongming_task.stores.postgres"), schema)
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            started = time.perf_counter()
            fill(conn, schema, args.commands, args.open)
            print(
                f"{args.commands:,} commands, {args.open} open "
                f"(filled in {time.perf_counter() - started:.0f} s)\n"
            )
            at = (now + timedelta(minutes=1)).isoformat()
            picked = [f"c{args.commands - k}" for k in range(10)]
            cases = [
                (
                    "reference: one command by its key",
                    f"SELECT * FROM {schema}.commands WHERE command_id = %s",
                    [f"c{args.commands // 2}"],
                ),
                ("the claim's read of the open commands", sql["open_commands"], [at, 50]),
                (
                    "... of one node's (its tasks', and nobody's)",
                    sql["open_commands_for"],
                    [at, "node-7", 50],
                ),
                ("the claim's lock of those it picked", sql["lock_commands"], [picked, at]),
                ("the beacon's pulse", sql["pulse_node"], [None, None, "n"]),
                ("a task's pending commands", sql["pending_commands"], ["t7"]),
                (
                    "retention: 500 old finished commands",
                    sql["prune_finished_commands"],
                    [(now - timedelta(days=1)).isoformat(), 500],
                ),
            ]
            for label, statement, params in cases:
                lines, ms = plan(conn, statement, params)
                scans = [line.strip() for line in lines if "Scan" in line]
                seq = any("Seq Scan on commands" in s for s in scans)
                print(f"{label}: {ms:.3f} ms{'  SEQ SCAN' if seq else ''}")
                for line in scans:
                    print(f"    {line}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
