"""Time to durable: from a task's function ending to its success being in the store,
seen by another process, on SQLite and PostgreSQL.

    uv run python bench/durable.py [--tasks 4000] [--workers 4] [--dsn postgresql://...]

Each no-op task notes the wall-clock time its function ends (``time.time()``, the last
thing it does). An observer process, started before the first submit, asks the store
over its own connection which tasks are ``succeeded`` (one indexed query a pass, as
often as it can, at most every millisecond) and notes when it first saw each. A task's
time to durable is the first minus the second: what a reader elsewhere (the CLI, the
dashboard, a node after this one crashed) waits for the truth the function's caller
could already have. The observer's own pass time is printed beside it: a figure is
late by up to one pass.

Two loads, as in ``bench/postgres_throughput.py``: ``burst`` submits every task in one
``submit_many`` and waits for all (a prefilled backlog draining); ``as you go`` submits
them one call at a time while the workers run (a web service's way). Rows: p50, p99 and
the worst, in milliseconds, and the rate the run reached. No other contender: the target
(p99 <= 50 ms) is an absolute line of the design, read beside the rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _stats import percentile  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, SqliteTaskStore, TaskStore, current

OBSERVER = r"""
import json, sys, time
kind, where, schema, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "sqlite":
    import sqlite3
    conn = sqlite3.connect(f"file:{where}?mode=ro", uri=True, timeout=30)
    query = "SELECT task_id FROM tasks WHERE status = 'succeeded'"
    ask = lambda: conn.execute(query).fetchall()
else:
    import psycopg
    conn = psycopg.connect(where, autocommit=True)
    query = f"SELECT task_id FROM {schema}.tasks WHERE status = 'succeeded'"
    ask = lambda: conn.execute(query).fetchall()
seen, passes, started = {}, 0, time.monotonic()
print("ready", flush=True)
deadline = time.monotonic() + 600
while len(seen) < expected and time.monotonic() < deadline:
    rows = ask()
    now = time.time()
    passes += 1
    for (task_id,) in rows:
        seen.setdefault(task_id, now)
    if len(rows) == len(seen):
        time.sleep(0.001)
print(json.dumps({"seen": seen, "pass_ms": (time.monotonic() - started) * 1000 / passes}))
"""


def noted(ends: dict[str, float]) -> Any:
    def noop(token: CancellationToken) -> None:
        here = current()
        assert here is not None
        ends[here.task_id] = time.time()

    return noop


def observe(kind: str, where: str, schema: str, expected: int) -> subprocess.Popen[str]:
    watcher = subprocess.Popen(
        [sys.executable, "-c", OBSERVER, kind, where, schema, str(expected)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdout is not None
    assert watcher.stdout.readline().strip() == "ready"
    return watcher


def one_run(store: TaskStore, kind: str, where: str, schema: str, args: Any, load: str) -> str:
    ends: dict[str, float] = {}
    watcher = observe(kind, where, schema, args.tasks)
    with Controller(store, max_workers=args.workers) as node:
        task = node.task(noted(ends), name="noop")
        started = time.perf_counter()
        if load == "burst":
            runs = task.submit_many([()] * args.tasks)
        else:
            runs = [task.submit() for _ in range(args.tasks)]
        for run in runs:
            run.wait(600)
        rate = args.tasks / (time.perf_counter() - started)
    out, _ = watcher.communicate(timeout=600)
    found = json.loads(out)
    seen: dict[str, float] = found["seen"]
    lags = sorted((seen[t] - ends[t]) * 1000 for t in ends if t in seen)
    missing = len(ends) - len(lags)
    p99 = percentile(lags, 99)
    return (
        f"  {kind:<10} {load:<10} p50 {statistics.median(lags):7.1f}  p99 {p99:7.1f}  "
        f"worst {lags[-1]:7.1f} ms   {rate:7,.0f} tasks/s   observer pass "
        f"{found['pass_ms']:.1f} ms{f'   NOT SEEN {missing}' if missing else ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dsn", help="a PostgreSQL database to add its rows")
    args = parser.parse_args()
    print(f"{args.tasks} no-op tasks, {args.workers} workers: function end -> success seen")
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("burst", "as you go"):
            db = Path(tmp) / f"{uuid.uuid4().hex}.db"
            print(one_run(SqliteTaskStore(db), "sqlite", str(db), "", args, load), flush=True)
    if args.dsn:
        import psycopg

        from chongming_task.stores.postgres import PostgresTaskStore

        for load in ("burst", "as you go"):
            schema = f"durable_{uuid.uuid4().hex[:12]}"
            store = PostgresTaskStore(args.dsn, schema=schema)
            store.create_schema()
            try:
                print(one_run(store, "postgres", args.dsn, schema, args, load), flush=True)
            finally:
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
