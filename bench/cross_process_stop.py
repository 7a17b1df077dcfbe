"""Cross-process stop latency: a stop requested in process B until ``stopped`` is in the
store, for tasks running in node process A (shared SQLite file).

    uv run python bench/cross_process_stop.py [--stops N] [--poll SECONDS] [--dsn DSN]

With ``--dsn`` the shared store is PostgreSQL (a fresh schema), else a SQLite file.

A's tasks checkpoint every 10 ms; A polls commands every ``--poll`` seconds (default:
the node's own choice, 60 s where the store wakes it and its beacon looks at the queue),
and is woken at once when a command arrives (SQLite: a named pipe per process beside the
file; PostgreSQL: ``NOTIFY``), so the poll is only the fallback. Targets: p99 <= 50 ms on
SQLite, <= 15 ms on PostgreSQL. The reference row is the same measurement for a stop of
a task held by B itself (no command, no poll), in the same run. Last (SQLite), the CPU
an idle node process spends over 5 s (nothing to run, nothing sent; from ``/proc``), the
cost of waiting for commands.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _stats import latency_row  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, TaskStatus, TaskStore
from chongming_task.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
ROUND = 20


def wait_stopped(b: Controller, task_id: str) -> None:
    tick = threading.Event()
    while b.store.get(task_id).status is not TaskStatus.STOPPED:  # type: ignore[union-attr]
        tick.wait(0.001)


def open_shared(db: Path | str, schema: str | None) -> TaskStore:
    return open_store(db, schema=schema)


def remote(db: Path | str, stops: int, poll: str, schema: str | None = None) -> list[float]:
    out: list[float] = []
    b = Controller(open_shared(db, schema), owner="bench-console")
    extra = ["--schema", schema] if schema else []
    while len(out) < stops:
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.node",
                str(db),
                *extra,
                "--poll",
                poll,
                "--workers",
                str(ROUND),
                *["--submit", "loop"] * ROUND,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert node.stdout is not None and node.stdin is not None
        ids = []
        for line in node.stdout:
            data = json.loads(line)
            if "ready" in data:
                break
            ids.append(data["task_id"])
        for task_id in ids:
            while b.store.get(task_id).status is not TaskStatus.RUNNING:  # type: ignore[union-attr]
                time.sleep(0.005)
        for task_id in ids[: stops - len(out)]:
            time.sleep(0.0137 * (len(out) % 37))  # spread requests over the poll cycle
            start = time.perf_counter()
            assert b.stop(task_id).accepted
            wait_stopped(b, task_id)
            out.append(time.perf_counter() - start)
        node.stdin.close()
        node.wait(60)
        node.stdout.close()
    b.close()
    b.store.close()
    return out


def local(db: Path | str, stops: int, schema: str | None = None) -> list[float]:
    store = open_shared(db, schema)
    b = Controller(store, owner="bench-local", max_workers=4)

    @b.task(name="loop")
    def loop(token: CancellationToken) -> None:
        while True:
            token.checkpoint()
            token.sleep(0.010)

    out = []
    for _ in range(stops):
        run = b.submit(loop)
        while run.status is not TaskStatus.RUNNING:
            time.sleep(0.001)
        start = time.perf_counter()
        b.stop(run.task_id)
        wait_stopped(b, run.task_id)
        out.append(time.perf_counter() - start)
    b.close()
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=200)
    parser.add_argument(
        "--poll", default="default", help="seconds, or 'default': the node's own choice"
    )
    parser.add_argument("--dsn", default=None, help="share a PostgreSQL store instead")
    args = parser.parse_args()
    schema = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.dsn:
            from chongming_task.stores.postgres import PostgresTaskStore

            schema = f"bench_stop_{int(time.time())}"
            setup = PostgresTaskStore(args.dsn, schema=schema)
            setup.create_schema()
            setup.close()
        local_db: Path | str = args.dsn or Path(tmp) / "l.db"
        remote_db: Path | str = args.dsn or Path(tmp) / "r.db"
        rows = {
            "stop of a task held here (reference)": local(local_db, args.stops, schema),
            f"stop across processes (poll {args.poll})": remote(
                remote_db, args.stops, args.poll, schema
            ),
        }
        if args.dsn and schema:
            import psycopg

            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")
    store_name = "PostgreSQL" if args.dsn else "SQLite file"
    print(f"stop request -> 'stopped' in the store, {args.stops} stops, {store_name}")
    print(f"{'contender':40} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, values in rows.items():
        print(latency_row(name, values))
    print(f"target: p99 <= {15 if args.dsn else 50} ms across processes")
    if not args.dsn:
        with tempfile.TemporaryDirectory() as tmp:
            idle = idle_cpu(Path(tmp) / "idle.db", args.poll)
        print(f"an idle node's CPU over 5 s (poll {args.poll}): {idle * 1000:.0f} ms")


def idle_cpu(db: Path, poll: str) -> float:
    """CPU seconds a node process with nothing to do spends over 5 s."""
    node = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.node", str(db), "--poll", poll],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert node.stdout is not None and node.stdin is not None
    for line in node.stdout:
        if "ready" in json.loads(line):
            break
    time.sleep(1.0)  # past its start

    def cpu() -> float:
        fields = Path(f"/proc/{node.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = cpu()
    time.sleep(5.0)
    spent = cpu() - before
    node.stdin.close()
    node.wait(60)
    node.stdout.close()
    return spent


if __name__ == "__main__":
    main()
