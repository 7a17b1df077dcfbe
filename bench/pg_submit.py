"""A per-call submit on PostgreSQL against pgqueuer's ``enqueue``, side by side.

    uv run --group bench python bench/pg_submit.py [--dsn DSN] [--jobs N] [--rounds R]

Each contender enqueues ``--jobs`` jobs one by one from one thread, each call returning
once its job is committed; the time is from the first call to the last return. In the
same rounds (each contender once a round, the order turning):

* **raw**: one connection committing a one-row insert a call (the floor of a durable
  write on this server);
* **pgqueuer**: ``Queries.enqueue`` a call on one connection, no worker running;
* **enqueue, jobs running**: the same while a ``QueueManager`` runs the jobs as they
  come, on the same event loop;
* **submit, workers busy**: ``Controller.submit`` a call while its one worker is held by
  a task, so that only the creates are written (what ``enqueue`` writes);
* **submit, tasks running**: ``Controller.submit`` a call while four workers run the
  tasks as they come (each task's start and end written as well).

Beside each rate, the database's commits and rows written per job (``pg_stat_database``,
every connection of the contender included). Targets, like against like: a submit with
the workers busy at least as fast as ``enqueue`` with no worker; a submit with the tasks
running at least as fast as ``enqueue`` with the jobs running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from _stats import database_writes, in_rounds  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller
from chongming_task.stores.postgres import PostgresTaskStore


def _counted(dsn: str, jobs: int, run: Callable[[], float]) -> tuple[float, float, float]:
    """(jobs/s, commits a job, rows a job)."""
    commits, rows = database_writes(dsn)
    rate = run()
    time.sleep(0.6)  # each backend flushes its counters when it ends, or every 0.5 s
    after_commits, after_rows = database_writes(dsn)
    return rate, (after_commits - commits - 1) / jobs, (after_rows - rows) / jobs


def raw(dsn: str, schema: str, jobs: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.raw (id bigint PRIMARY KEY)".encode())
        conn.execute(f"TRUNCATE {schema}.raw".encode())
        insert = f"INSERT INTO {schema}.raw VALUES (%s)".encode()
        started = time.perf_counter()
        for i in range(jobs):
            conn.execute(insert, [i])
        return jobs / (time.perf_counter() - started)


def pgqueuer(dsn: str, schema: str, jobs: int, *, run_them: bool) -> float:
    """``enqueue`` a call; ``run_them``: with a ``QueueManager`` running the jobs as they
    come, on the same event loop (its connection apart), as a service would."""
    from datetime import timedelta

    from pgqueuer import PsycopgDriver, Queries, QueueManager

    async def main() -> float:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        worker = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            for c in (conn, worker):
                await c.execute(f"SET search_path = {schema}".encode())
            client = Queries(PsycopgDriver(conn))
            manager = QueueManager(Queries(PsycopgDriver(worker)))
            done = asyncio.Event()
            count = [0]

            @manager.entrypoint("noop")
            async def noop(job: object) -> None:
                count[0] += 1
                if count[0] >= jobs:
                    done.set()

            runner = (
                asyncio.create_task(manager.run(dequeue_timeout=timedelta(seconds=1)))
                if run_them
                else None
            )
            started = time.perf_counter()
            for _ in range(jobs):
                await client.enqueue("noop", None)
            rate = jobs / (time.perf_counter() - started)
            if runner is not None:
                await asyncio.wait_for(done.wait(), 300)
                manager.shutdown.set()
                await runner
            else:
                await conn.execute(b"DELETE FROM pgqueuer")
            return rate
        finally:
            await conn.close()
            await worker.close()

    return asyncio.run(main())


def submit(dsn: str, schema: str, jobs: int, *, run_them: bool) -> float:
    store = PostgresTaskStore(dsn, schema=schema)
    node = Controller(store, max_workers=4 if run_them else 1)
    gate = threading.Event()

    @node.task(name="noop")
    def noop(token: CancellationToken) -> None:
        return None

    @node.task(name="hold")
    def hold(token: CancellationToken) -> None:
        gate.wait(120)

    node.tasks["noop"].submit().wait(10)
    if not run_them:
        held = node.tasks["hold"].submit()
        while held.status.value != "running":
            time.sleep(0.001)
    started = time.perf_counter()
    runs: list[Any] = [node.tasks["noop"].submit() for _ in range(jobs)]
    rate = jobs / (time.perf_counter() - started)
    gate.set()
    for run in runs:
        run.wait(300)
    node.close()
    store.close()
    return rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    schema = f"chongming_submit_{os.getpid()}"
    made = PostgresTaskStore(a.dsn, schema=schema)
    made.create_schema()
    made.close()
    from pgqueuer import PsycopgDriver, Queries

    async def install() -> None:
        async with await psycopg.AsyncConnection.connect(a.dsn, autocommit=True) as conn:
            await conn.execute(f"SET search_path = {schema}".encode())
            await Queries(PsycopgDriver(conn)).install()

    asyncio.run(install())
    jobs = a.jobs
    try:
        contenders = {
            "raw one-row commits": lambda: _counted(a.dsn, jobs, lambda: raw(a.dsn, schema, jobs)),
            "pgqueuer enqueue": lambda: _counted(
                a.dsn, jobs, lambda: pgqueuer(a.dsn, schema, jobs, run_them=False)
            ),
            "enqueue, jobs running": lambda: _counted(
                a.dsn, jobs, lambda: pgqueuer(a.dsn, schema, jobs, run_them=True)
            ),
            "submit, workers busy": lambda: _counted(
                a.dsn, jobs, lambda: submit(a.dsn, schema, jobs, run_them=False)
            ),
            "submit, tasks running": lambda: _counted(
                a.dsn, jobs, lambda: submit(a.dsn, schema, jobs, run_them=True)
            ),
        }
        results = in_rounds(contenders, a.rounds)
    finally:
        with psycopg.connect(a.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
    print(f"{jobs} jobs a run, one by one from one thread, {a.rounds} rounds")
    print(f"  {'':<24} {'jobs/s each round':>30}  commits/job  rows/job")
    for name, rows in results.items():
        rates = "  ".join(f"{r[0]:>7,.0f}" for r in rows)
        commits = statistics.median(r[1] for r in rows)
        written = statistics.median(r[2] for r in rows)
        print(f"  {name:<24} {rates:>30}  {commits:11.2f}  {written:8.2f}")
    for ours, theirs in (
        ("submit, workers busy", "pgqueuer enqueue"),
        ("submit, tasks running", "enqueue, jobs running"),
        # Not like against like (our tasks run, its jobs do not): printed as it is the
        # figure a reader meets first when comparing the two calls.
        ("submit, tasks running", "pgqueuer enqueue"),
    ):
        ratio = [r[0] / q[0] for r, q in zip(results[ours], results[theirs], strict=True)]
        if theirs == "pgqueuer enqueue" and ours != "submit, workers busy":
            print("unlike work, for reference only:")
        print(
            f"{ours} / {theirs}: {statistics.median(ratio):.2f}x "
            f"(rounds {' '.join(f'{x:.2f}' for x in ratio)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
