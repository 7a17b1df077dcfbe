"""The operator's commands on a store of a million tasks, each beside its raw-SQL floor.

    uv run python bench/scale.py [--tasks 1000000] [--small 100000] [--dsn DSN]

For SQLite (a file) and, with ``--dsn``, PostgreSQL (a fresh schema, dropped afterwards),
the store is filled with ``--tasks`` tasks: all but 2,000 finished, 1,000 running under a
live lease, 1,000 queued, spread over 64 buckets, and two live nodes declaring 0-31 and
32-63. Then, in the same run:

* each CLI command (``stats``, ``buckets``, ``nodes``, ``doctor``, ``ps``) as a real
  subprocess: wall time and peak memory (``ru_maxrss`` of that child), beside the raw SQL
  that answers the same question, and beside ``--help`` (the interpreter's start, the
  floor of any CLI command). The same commands run on a store of ``--small`` tasks: a
  command whose memory grows with the store shows it there.
* the "my buckets" query a node makes (non-terminal tasks of 16 buckets), in process;
* the dashboard follower's read of the store-wide aggregates, in process, with the
  finished tasks' chart (a whole-table read) beside its raw SQL;
* bulk create: 20,000 tasks through the store's ``create_many`` (what ``submit_many``
  calls) in batches of 1,000, beside the raw bulk insert of the same rows;
* ``doctor`` and ``ps`` again once 50,000 tasks are running under expired leases;
* ``reconcile()`` of 100,000 tasks whose lease expired (rows turned into running tasks
  of a dead node), beside one raw ``UPDATE`` of the same rows (rolled back).

The fill itself is not measured (rows are written with raw SQL, the way a store that
has run for months holds them; the finished tasks carry no trail rows; on PostgreSQL the
tables are then analyzed, as autovacuum would soon after a load this size).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task import Controller, TaskQuery, TaskSnapshot, TaskStatus
from chongming_task.model import NodeRecord, Transition
from chongming_task.states import NON_TERMINAL
from chongming_task.stores import codec
from chongming_task.stores.protocol import TaskStore
from chongming_task.stores.sql import load_named

NOW = datetime.now(UTC)
LIVE = 1_000  # running, live lease
QUEUED = 1_000
EXPIRED = 100_000
STALE = 50_000
COMMANDS = ["stats", "buckets", "nodes", "doctor", "ps"]


@dataclass
class Target:
    label: str
    cli: list[str]  # --db ... (and --pg-schema)
    open: Callable[[], TaskStore]
    raw: Callable[[str, list[Any]], Any]  # run one raw SQL statement, return its rows
    raw_update_rolled_back: Callable[[str, list[Any]], float]
    insert_rows: Callable[[list[list[Any]], list[list[Any]]], None]
    placeholder: str
    drop: Callable[[], None]
    analyze: Callable[[], None] = lambda: None


def _rows(tasks: int) -> Iterator[tuple[list[Any], list[Any] | None]]:
    """Task rows (and, for unfinished tasks, their last trail row) in codec order."""
    created = NOW - timedelta(days=2)
    for i in range(tasks):
        owner = "node-a" if i % 64 < 32 else "node-b"  # the node declaring its bucket
        if i < LIVE:
            status, lease = TaskStatus.RUNNING, NOW + timedelta(hours=1)
        elif i < LIVE + QUEUED:
            status, lease = TaskStatus.QUEUED, NOW + timedelta(hours=1)
        else:
            status, lease = TaskStatus.SUCCEEDED, None
        snapshot = TaskSnapshot(
            task_id=f"t{i:09d}",
            name=f"job-{i % 10}",
            status=status,
            status_version=1 if status is TaskStatus.QUEUED else 4,
            created_at=created + timedelta(milliseconds=i),
            started_at=None if status is TaskStatus.QUEUED else created,
            ended_at=created if status is TaskStatus.SUCCEEDED else None,
            bucket=i % 64,
            bucket_key=f"k{i}",
            owner=owner,
            lease_owner=owner,
            lease_until=lease,
            tags=frozenset({"bench"}),
        )
        trail = None
        if not snapshot.is_terminal:
            trail = codec.transition_to_values(
                Transition(
                    task_id=snapshot.task_id,
                    version=snapshot.status_version,
                    from_status=None,
                    to_status=status,
                    at=NOW - timedelta(seconds=5),
                )
            )
        yield codec.snapshot_to_values(snapshot), trail


def fill(target: Target, tasks: int) -> None:
    batch: list[list[Any]] = []
    trails: list[list[Any]] = []
    for row, trail in _rows(tasks):
        batch.append(row)
        if trail is not None:
            trails.append(trail)
        if len(batch) == 20_000:
            target.insert_rows(batch, trails)
            batch, trails = [], []
    if batch:
        target.insert_rows(batch, trails)
    target.analyze()
    store = target.open()
    for node, buckets in (("node-a", range(0, 32)), ("node-b", range(32, 64))):
        store.declare_node(  # type: ignore[attr-defined]
            NodeRecord(
                node=node,
                buckets=frozenset(buckets),
                num_buckets=64,
                ttl_seconds=3600.0,
                started_at=NOW,
                seen_at=NOW,
                host="bench",
                pid=1,
            )
        )
    store.close()


def sqlite_target(path: Path) -> Target:
    from chongming_task import SqliteTaskStore

    SqliteTaskStore(path).close()  # the schema

    def raw(sql: str, params: list[Any]) -> Any:
        conn = sqlite3.connect(path)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def raw_update(sql: str, params: list[Any]) -> float:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            start = time.perf_counter()
            conn.execute(sql, params)
            took = time.perf_counter() - start
            conn.execute("ROLLBACK")
            return took
        finally:
            conn.close()

    def insert(rows: list[list[Any]], trails: list[list[Any]]) -> None:
        conn = sqlite3.connect(path)
        with conn:
            marks = ", ".join("?" * len(codec.TASK_COLUMNS))
            conn.executemany(
                f"INSERT INTO tasks ({', '.join(codec.TASK_COLUMNS)}) VALUES ({marks})", rows
            )
            # The trail is keyed by its task's seq (schema 9): the store's own statement.
            conn.executemany(load_named("chongming_task.stores.sqlite")["append"], trails)
        conn.close()

    return Target(
        label="SQLite",
        cli=["--db", str(path)],
        open=lambda: SqliteTaskStore(path),
        raw=raw,
        raw_update_rolled_back=raw_update,
        insert_rows=insert,
        placeholder="?",
        drop=lambda: None,
    )


def postgres_target(dsn: str, schema: str) -> Target:
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore

    made = PostgresTaskStore(dsn, schema=schema)
    made.create_schema()
    made.close()
    options = f"-c search_path={schema}"

    def raw(sql: str, params: list[Any]) -> Any:
        with psycopg.connect(dsn, options=options) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()

    def raw_update(sql: str, params: list[Any]) -> float:
        with psycopg.connect(dsn, options=options) as conn:
            start = time.perf_counter()
            conn.execute(sql.replace("?", "%s"), params)
            took = time.perf_counter() - start
            conn.rollback()
            return took

    def insert(rows: list[list[Any]], trails: list[list[Any]]) -> None:
        with psycopg.connect(dsn, options=options) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY tasks ({', '.join(codec.TASK_COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            with cur.copy(
                f"COPY transitions ({', '.join(codec.TRANSITION_COLUMNS)}) FROM STDIN"
            ) as copy:
                for trail in trails:
                    copy.write_row(trail)

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    def analyze() -> None:
        # What autovacuum does soon after a load this size: the planner's statistics.
        with psycopg.connect(dsn, options=options, autocommit=True) as conn:
            conn.execute("ANALYZE tasks")
            conn.execute("ANALYZE transitions")

    return Target(
        label="PostgreSQL",
        cli=["--db", dsn, "--pg-schema", schema],
        open=lambda: PostgresTaskStore(dsn, schema=schema),
        raw=raw,
        raw_update_rolled_back=raw_update,
        insert_rows=insert,
        placeholder="%s",
        drop=drop,
        analyze=analyze,
    )


# A small launcher measures the command's peak memory: a child forked from this (large)
# process would count the parent's pages it started with.
_LAUNCH = (
    "import resource, subprocess, sys; "
    "code = subprocess.run(sys.argv[1:], stdout=sys.stdout).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(code)"
)


def run_cli(target: Target, *args: str) -> tuple[float, float, str]:
    """Wall seconds (launcher included: it is the same for every command, ``--help``
    shows it), peak RSS in MiB of the command alone, and its stdout."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "chongming_task", *target.cli, *args]
    result = subprocess.run(
        [sys.executable, "-c", _LAUNCH, *command],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if result.returncode not in (0, 3):
        raise SystemExit(f"{args} exited {result.returncode}: {result.stderr}")
    maxrss_kib = int(result.stderr.strip().splitlines()[-1])
    return wall, maxrss_kib / 1024, result.stdout


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


RAW = {
    "stats": "SELECT status, COUNT(*) FROM tasks GROUP BY status",
    "buckets": "SELECT bucket, COUNT(*) FROM tasks GROUP BY bucket",
    "nodes": "SELECT lease_owner, COUNT(*) FROM tasks WHERE status IN "
    "('starting', 'running', 'pausing', 'paused', 'stopping') GROUP BY lease_owner",
    "doctor": "SELECT COUNT(*) FROM tasks WHERE status IN "
    "('pending', 'queued', 'starting', 'running', 'pausing', 'paused', 'stopping') "
    "AND (lease_until IS NULL OR lease_until <= ?)",
    "ps": "SELECT * FROM tasks WHERE status IN "
    "('pending', 'queued', 'starting', 'running', 'pausing', 'paused', 'stopping')",
}


def measure_cli(target: Target, tasks: int) -> dict[str, tuple[float, float, float]]:
    """Per command: CLI wall seconds, CLI peak MiB, raw SQL seconds."""
    out: dict[str, tuple[float, float, float]] = {}
    wall, rss, _ = run_cli(target, "--help")
    out["--help"] = (wall, rss, 0.0)
    for command in COMMANDS:
        params = [codec.encode_dt(NOW)] if "?" in RAW[command] else []
        sql = RAW[command]
        if target.label == "SQLite" and command == "buckets":
            # Its bucket index holds only tasks with a bucket (the GROUP BY above would
            # read the table): the store's own statement is the floor.
            sql = load_named("chongming_task.stores.sqlite")["bucket_totals"]
        raw = min(timed(lambda: target.raw(sql, params)) for _ in range(3))  # noqa: B023
        runs = [run_cli(target, command) for _ in range(3)]
        out[command] = (min(r[0] for r in runs), max(r[1] for r in runs), raw)
    return out


@contextmanager
def opened(target: Target) -> Iterator[TaskStore]:
    store = target.open()
    try:
        yield store
    finally:
        store.close()


def measure_expired(target: Target) -> dict[str, float]:
    """``doctor`` and ``ps`` (CLI wall seconds, best of three) once STALE finished tasks
    were turned into running tasks of a dead node whose leases ran out: the alarms'
    scans then find work, and ``ps`` has that many unfinished rows to bound."""
    past = codec.encode_dt(NOW - timedelta(hours=1))
    _expire(target, past, f"t{LIVE + QUEUED:09d}", f"t{LIVE + QUEUED + STALE:09d}")
    return {
        command: min(run_cli(target, command)[0] for _ in range(3)) for command in ("doctor", "ps")
    }


def measure_reconcile(target: Target) -> tuple[float, float, int]:
    """Turn EXPIRED finished tasks into running tasks of a dead node, then time one raw
    UPDATE of them (rolled back) and ``reconcile()``."""
    past = codec.encode_dt(NOW - timedelta(hours=1))
    _expire(target, past, f"t{LIVE + QUEUED:09d}", f"t{LIVE + QUEUED + EXPIRED:09d}")
    raw = target.raw_update_rolled_back(
        "UPDATE tasks SET status = 'lost', status_version = status_version + 1 "
        "WHERE status = 'running' AND lease_until <= ?",
        [codec.encode_dt(NOW)],
    )
    with opened(target) as store:
        node = Controller(store, owner="survivor", poll_commands=False)
        try:
            took = timed(lambda: node.reconcile())
            lost = node.stats().get(TaskStatus.LOST, 0)
        finally:
            node.close()
    return raw, took, lost


def _expire(target: Target, past: str | None, ids_from: str, ids_to: str) -> None:
    sql = (
        "UPDATE tasks SET status = 'running', ended_at = NULL, lease_owner = 'dead', "
        "lease_until = ? WHERE task_id >= ? AND task_id < ?"
    )
    if target.label == "SQLite":
        conn = sqlite3.connect(target.cli[1])
        with conn:
            conn.execute(sql, [past, ids_from, ids_to])
        conn.close()
    else:
        import psycopg

        dsn, schema = target.cli[1], target.cli[3]
        with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
            conn.execute(sql.replace("?", "%s"), [past, ids_from, ids_to])


def my_buckets(target: Target) -> tuple[float, float, int]:
    """A node's own non-terminal tasks (16 buckets), in process, beside raw SQL."""
    buckets = frozenset(range(16))
    with opened(target) as store:
        query = TaskQuery(statuses=NON_TERMINAL, buckets=buckets)
        store.query(query)  # warm
        took = min(timed(lambda: store.query(query)) for _ in range(5))
        found = len(store.query(query))
    marks = ", ".join(["?"] * 16)
    sql = (
        "SELECT * FROM tasks WHERE status IN ('pending', 'queued', 'starting', 'running', "
        f"'pausing', 'paused', 'stopping') AND bucket IN ({marks})"
    )
    raw = min(timed(lambda: target.raw(sql, list(buckets))) for _ in range(5))
    return took, raw, found


def dashboard_read(target: Target) -> tuple[float, float, float]:
    """The dashboard follower's read of the store-wide aggregates (one pass of
    ``read_aggregates``), the finished tasks' timeline alone (the overview's chart: the
    whole table, as no index holds ``ended_at``), and the raw SQL floor of that timeline."""
    from chongming_task.stores.capabilities import Capabilities
    from chongming_task.web.follow import SLOT, read_aggregates

    since = NOW - timedelta(minutes=10)
    with opened(target) as store:
        caps = Capabilities(store)
        read_aggregates(caps, 64)  # warm
        whole = min(timed(lambda: read_aggregates(caps, 64)) for _ in range(3))
        chart = min(timed(lambda: caps.ended_timeline(since=since, width=SLOT)) for _ in range(3))
    sql = "SELECT status, COUNT(*) FROM tasks WHERE ended_at >= ? GROUP BY status"
    params = [codec.encode_dt(since)]
    raw = min(timed(lambda: target.raw(sql, params)) for _ in range(3))
    return whole, chart, raw


def bulk_create(target: Target, tasks: int = 20_000, batch: int = 1_000) -> tuple[float, float]:
    """Tasks per second created through the store's capability (``create_many`` where
    it has one: what ``submit_many`` calls), beside the raw bulk insert of the same rows
    (``executemany`` on SQLite, ``COPY`` on PostgreSQL)."""
    from chongming_task.stores.capabilities import Capabilities

    def items(prefix: str) -> list[tuple[TaskSnapshot, Transition]]:
        out = []
        for i in range(tasks):
            snapshot = TaskSnapshot(
                task_id=f"{prefix}{i:09d}",
                name="bulk",
                status=TaskStatus.QUEUED,
                status_version=1,
                created_at=NOW,
                bucket=i % 64,
                lease_owner="bulk",
                lease_until=NOW + timedelta(hours=1),
            )
            created = Transition(
                task_id=snapshot.task_id,
                version=1,
                from_status=None,
                to_status=TaskStatus.QUEUED,
                at=NOW,
            )
            out.append((snapshot, created))
        return out

    ours, raw = items("b"), items("r")
    with opened(target) as store:
        caps = Capabilities(store)
        start = time.perf_counter()
        for offset in range(0, tasks, batch):
            caps.create_many(ours[offset : offset + batch])
        took = time.perf_counter() - start
    start = time.perf_counter()
    for offset in range(0, tasks, batch):
        part = raw[offset : offset + batch]
        target.insert_rows(
            [codec.snapshot_to_values(s) for s, _ in part],
            [codec.transition_to_values(t) for _, t in part],
        )
    floor = time.perf_counter() - start
    return tasks / took, tasks / floor


def report(label: str, tasks: int, small: int, big: dict[str, Any], little: dict[str, Any]) -> None:
    print(f"\n{label}: {tasks:,} tasks ({LIVE + QUEUED:,} unfinished); memory also at {small:,}")
    print(
        f"{'command':10} {'CLI s':>7} {'raw SQL s':>10} {'MiB':>7} {'MiB small':>10} {'< 1 s':>6}"
    )
    for command in ["--help", *COMMANDS]:
        wall, rss, raw = big[command]
        ok = "" if command == "--help" else ("yes" if wall < 1 else "NO")
        print(f"{command:10} {wall:7.2f} {raw:10.4f} {rss:7.1f} {little[command][1]:10.1f} {ok:>6}")


def run(target: Target, tasks: int, small_target: Target, small: int) -> dict[str, Any]:
    fill(target, tasks)
    fill(small_target, small)
    big = measure_cli(target, tasks)
    little = measure_cli(small_target, small)
    report(target.label, tasks, small, big, little)
    took, raw, found = my_buckets(target)
    print(
        f"my-buckets query (16 of 64 buckets, {found} tasks): {took * 1000:.1f} ms, raw "
        f"SQL {raw * 1000:.1f} ms, target < 100 ms: {'met' if took < 0.1 else 'NOT met'}"
    )
    whole, chart, raw_chart = dashboard_read(target)
    print(
        f"dashboard aggregates (one follower pass): {whole:.2f} s, of which the finished "
        f"chart {chart:.2f} s (raw SQL {raw_chart:.2f} s)"
    )
    rate, floor = bulk_create(target)
    print(
        f"bulk create (create_many, batches of 1,000): {rate:,.0f} tasks/s; raw bulk insert "
        f"of the same rows {floor:,.0f} tasks/s"
    )
    stale = measure_expired(target)
    print(
        f"with {STALE:,} expired leases: doctor {stale['doctor']:.2f} s, ps "
        f"{stale['ps']:.2f} s, target < 1 s: "
        f"{'met' if max(stale.values()) < 1 else 'NOT met'}"
    )
    raw_update, reconcile, lost = measure_reconcile(target)
    print(
        f"reconcile of {EXPIRED:,} expired: {reconcile:.2f} s ({lost:,} lost), raw UPDATE "
        f"{raw_update:.2f} s, target < 5 s: {'met' if reconcile < 5 else 'NOT met'}"
    )
    return {
        "cli": big,
        "small": little,
        "my_buckets": took,
        "dashboard_read": whole,
        "finished_chart": chart,
        "bulk_create": rate,
        "reconcile": reconcile,
        "stale": stale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (adds the Postgres rows)")
    parser.add_argument("--only", choices=["sqlite", "postgres"], default=None)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "postgres":
            results["sqlite"] = run(
                sqlite_target(Path(tmp) / "big.db"),
                args.tasks,
                sqlite_target(Path(tmp) / "small.db"),
                args.small,
            )
        if args.dsn and args.only != "sqlite":
            tag = os.getpid()
            big, little = (
                postgres_target(args.dsn, f"bench_scale_{tag}"),
                postgres_target(args.dsn, f"bench_scale_small_{tag}"),
            )
            try:
                results["postgres"] = run(big, args.tasks, little, args.small)
            finally:
                big.drop()
                little.drop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
