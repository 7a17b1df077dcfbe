"""What an idle node costs a PostgreSQL server: transactions a second and connections.

    uv run python bench/idle_node.py [--nodes 4] [--seconds 60] [--settle 100] [--dsn DSN]

Starts ``--nodes`` node processes (each a ``Controller`` declaring all 64 buckets, with
an hourly schedule and no task) on a database of its own (created and dropped here),
waits ``--settle`` seconds (pools shrink after 30 s unused; the server's statistics lag
up to 10 s), then counts the
database's transactions (``pg_stat_database``) over ``--seconds`` and its connections
(``pg_stat_activity``). The same nodes then run again as a reference with a command poll
every 0.5 s and a pool of up to 10 (the settings of a node that polls the table), in the
same run. Targets: an idle node at most 0.2 transactions a second and 2 connections.
Last, one node running 100 tasks that never end (no transition in the window): its
upkeep (lease renewals, heartbeats, beacon) at most 1 transaction a second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

import psycopg

_NODE = """
import signal, sys
from chongming_task import Controller, CronTrigger
from chongming_task.stores.postgres import PostgresTaskStore
dsn, owner, poll, size, tasks = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
store = PostgresTaskStore(dsn, schema="idle", max_size=size)
node = Controller(store, owner=owner, owned_buckets=range(64), max_workers=tasks + 4,
                  command_poll_interval=None if poll == "default" else float(poll))

@node.task(name="long")
def long(token):  # checkpoints all the time, as a busy task does
    while True:
        token.checkpoint()
        token.sleep(0.05)

@node.task(name="report")
def report(token):
    return "sent"

# Schedules defined on every node, as replicas of one service define them: an hourly
# one costs nothing between its slots.
node.schedule("hourly-report", "report", CronTrigger("0 * * * *"))
for _ in range(tasks):
    node.tasks["long"].submit()
print("up", flush=True)
signal.sigwait({signal.SIGTERM})
node.close(timeout=10)
store.close()
"""


def measure(
    base: str,
    db: str,
    nodes: int,
    poll: str,
    size: int,
    settle: float,
    seconds: float,
    tasks: int = 0,
) -> tuple[float, int]:
    """(transactions a second, connections) of ``nodes`` idle nodes."""
    dsn = base.rsplit("/", 1)[0] + "/" + db
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _NODE, dsn, f"idle-{i}", poll, str(size), str(tasks)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(nodes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "up"
        time.sleep(settle)
        with psycopg.connect(base, autocommit=True) as mon:

            def xacts() -> int:
                mon.execute("SELECT pg_stat_clear_snapshot()")
                row = mon.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                    [db],
                ).fetchone()
                assert row is not None
                return int(row[0])

            before, start = xacts(), time.monotonic()
            time.sleep(seconds)
            rate = (xacts() - before) / (time.monotonic() - start)
            row = mon.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [db]
            ).fetchone()
            assert row is not None
            return rate, int(row[0])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=100.0)
    args = parser.parse_args()
    db = f"chongming_idle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    try:
        from chongming_task.stores.postgres import PostgresTaskStore

        made = PostgresTaskStore(args.dsn.rsplit("/", 1)[0] + "/" + db, schema="idle")
        made.create_schema()
        made.close()
        print(f"{args.nodes} idle nodes, {args.seconds:.0f} s after {args.settle:.0f} s")
        for label, poll, size in (("defaults", "default", 3), ("reference: poll 0.5 s", "0.5", 10)):
            rate, conns = measure(args.dsn, db, args.nodes, poll, size, args.settle, args.seconds)
            print(
                f"  {label:24} {rate / args.nodes:6.3f} transactions/s a node, "
                f"{conns / args.nodes:4.1f} connections a node"
            )
        # One node running 100 tasks that checkpoint every 50 ms and never end: no
        # transition in the window, so every transaction is the node's own upkeep.
        rate, conns = measure(args.dsn, db, 1, "default", 3, 30.0, args.seconds, tasks=100)
        print(
            f"  {'busy: 100 running tasks':24} {rate:6.3f} transactions/s, "
            f"{conns} connections (target: at most 1 transaction a second)"
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    main()
