"""What the helpers of readers cost the Postgres write path: the owner index (dropped
after ``create_schema()``) and the store's announcing of writes (``announce_writes``).

    uv run python bench/pg_write_cost.py [--dsn DSN] [--tasks 2000] [--rounds 3]

Each run is chongming-task alone in a fresh schema: ``--tasks`` x ``Controller.submit``
on 4 workers, every task queued -> starting -> running -> succeeded with its trail rows,
timed from the first submit to the last task's end. The variants alternate within each
round, so drift of the machine hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from chongming_task import CancellationToken, Controller
from chongming_task.stores.postgres import PostgresTaskStore

SCHEMA = "bench_write_cost"
_NO_INDEX = "DROP INDEX {s}.idx_tasks_owner"
VARIANTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "index, announcing (as shipped)": ((), True),
    "no owner index": ((_NO_INDEX,), True),
    "not announcing": ((), False),
    "neither": ((_NO_INDEX,), False),
}


def noop(token: CancellationToken) -> None:
    return None


def run(dsn: str, tasks: int, drops: tuple[str, ...], announce: bool) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    store = PostgresTaskStore(dsn, schema=SCHEMA, announce_writes=announce)
    store.create_schema()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in drops:
            conn.execute(statement.format(s=SCHEMA).encode())
    node = Controller(store, max_workers=4)
    try:
        job = node.task(noop, name="noop")
        start = time.perf_counter()
        runs = [node.submit(job) for _ in range(tasks)]
        for r in runs:
            r.wait(120)
        return tasks / (time.perf_counter() - start)
    finally:
        node.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for _ in range(args.rounds):
            for name, (drops, announce) in VARIANTS.items():
                rates[name].append(run(args.dsn, args.tasks, drops, announce))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    print(f"{args.tasks} durable no-op tasks, 4 workers, {args.rounds} rounds alternated")
    print(f"{'schema':32} {'tasks/s per round':>30} {'mean':>8}")
    for name, values in rates.items():
        each = " ".join(f"{v:7,.0f}" for v in values)
        print(f"{name:32} {each:>30} {statistics.mean(values):8,.0f}")


if __name__ == "__main__":
    main()
