"""Durable no-op task throughput on PostgreSQL: chongming-task vs procrastinate, pgqueuer.

    uv run --group bench python bench/postgres_throughput.py [--dsn DSN] [--tasks N]

Both run on the same local server, in the same run, each in a fresh database/schema:

* chongming-task: ``N`` x ``Controller.submit`` (one transaction each), then every task
  lives queued -> starting -> running -> succeeded, each transition committed with its
  audit-trail rows, on ``--workers`` threads;
* procrastinate (its async API, its fastest): ``N`` x ``defer_async``, then
  ``run_worker_async(concurrency=--workers, wait=False)`` until the queue is empty;
* pgqueuer (async, psycopg driver): ``N`` x ``enqueue``, then ``QueueManager.run`` in
  ``drain`` mode with its default batch size until the queue is empty.

Time is measured from the first submit/defer to the last task finished. procrastinate
and pgqueuer are benchmark-only dependencies (the ``bench`` group), never runtime ones.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chongming_task import CancellationToken, Controller
from chongming_task.stores.postgres import PostgresTaskStore

BENCH_DB = "chongming_bench"


def fresh_database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return make_conninfo(**{**conninfo_to_dict(dsn), "dbname": name})


def run_chongming(dsn: str, tasks: int, workers: int) -> float:
    store = PostgresTaskStore(fresh_database(dsn, BENCH_DB), max_size=workers + 4)
    store.create_schema()
    node = Controller(store, max_workers=workers)

    @node.task(name="noop")
    def noop(token: CancellationToken) -> None:
        return None

    start = time.perf_counter()
    runs = [node.submit(noop) for _ in range(tasks)]
    for run in runs:
        run.wait(300)
    elapsed = time.perf_counter() - start
    assert all(r.status.value == "succeeded" for r in runs)
    node.close()
    store.close()
    return elapsed


def run_procrastinate(dsn: str, tasks: int, workers: int) -> float:
    import procrastinate

    conninfo = fresh_database(dsn, BENCH_DB)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async def main() -> float:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            start = time.perf_counter()
            for _ in range(tasks):
                await noop.defer_async()
            await app.run_worker_async(
                concurrency=workers, wait=False, install_signal_handlers=False
            )
            elapsed = time.perf_counter() - start
            done = await app.connector.execute_query_one_async(
                "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'"
            )
            assert done["n"] == tasks, done
            return elapsed

    return asyncio.run(main())


def run_pgqueuer(dsn: str, tasks: int, workers: int) -> float:
    from datetime import timedelta

    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conninfo = fresh_database(dsn, BENCH_DB)

    async def main() -> float:
        worker_conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        client_conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        worker_queries = Queries(PsycopgDriver(worker_conn))
        await worker_queries.install()
        manager = QueueManager(worker_queries)

        @manager.entrypoint("noop")
        async def noop(job: object) -> None:
            return None

        client = Queries(PsycopgDriver(client_conn))
        start = time.perf_counter()
        for _ in range(tasks):
            await client.enqueue("noop", None)
        await manager.run(mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
        elapsed = time.perf_counter() - start
        left = await (await client_conn.execute("SELECT count(*) FROM pgqueuer")).fetchone()
        assert left is not None and left[0] == 0, left
        await worker_conn.close()
        await client_conn.close()
        return elapsed

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    rows = {
        "procrastinate (reference)": run_procrastinate,
        "pgqueuer (reference)": run_pgqueuer,
        "chongming-task + PostgresTaskStore": run_chongming,
    }
    print(f"{args.tasks} durable no-op tasks, {args.workers} workers, best of {args.repeat}")
    print(f"{'contender':40} {'tasks/s':>10}")
    for name, fn in rows.items():
        best = min(fn(args.dsn, args.tasks, args.workers) for _ in range(args.repeat))
        print(f"{name:40} {args.tasks / best:10,.0f}")
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
