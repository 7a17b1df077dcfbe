"""Submits with options against plain submits, and delayed tasks firing on time.

    uv run python bench/submit_options.py [--tasks N] [--rounds R] [--dsn DSN]
                                          [--delayed N] [--spread S]

* **options** (in memory, SQLite, and PostgreSQL with ``--dsn``): no-op tasks submitted
  one by one and waited for, from the first submit to the last end, plain against
  ``configure(priority=1)`` and ``configure(dedupe_key=<one per task>)``, each run on an empty
  store of its own (a store grown by the runs before would slow a round's later
  contenders), in rounds of one run each (target: each at most 10 % slower, a ratio of
  at least 0.91). SQLite's group commits a task and writes a commit are printed beside:
  a deduplicated create rides the group commit as a plain one does.
* **shared commits** (PostgreSQL, with ``--dsn``): eight threads submitting at once, as a
  web service's request handlers do, against one thread submitting the same tasks:
  tasks/s and the database's commits a task (its whole life), which the group commit
  shares among concurrent writers.
* **delayed** (SQLite): ``--delayed`` tasks (100,000) submitted in one batch with run-at
  times spread over ``--spread`` seconds from a few seconds ahead; each task notes when
  it started, and its lateness is that minus its run-at time (target: p99 at most 50 ms).
  While they all wait, the node's CPU over two seconds is set beside a node holding no
  waiting task over the same two seconds (target: near idle, the same order).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _stats import (  # bench/ is on sys.path when run as a script
    database_writes,
    in_rounds,
    percentile,
)
from chongming_task import CancellationToken, Controller, InMemoryTaskStore, current
from chongming_task.stores import open_store

WORKERS = 4


def current_id() -> str:
    """The running task's id (called inside a task function)."""
    running = current()
    assert running is not None
    return running.task_id


def _noop(token: CancellationToken) -> None:
    return None


def _commits(store: Any) -> tuple[int, int]:
    """A SQLite store's group commits so far and the writes they carried."""
    group = store.connection.group
    return group.commits, group.writes


def _fresh(place: tuple[str, str], run: int) -> tuple[Any, Callable[[], None]]:
    """An empty store for one run (every contender starts from the same nothing), and
    how to remove it."""
    kind, where = place
    if kind == "memory":
        return InMemoryTaskStore(), lambda: None
    if kind == "SQLite":
        return open_store(str(Path(where) / f"run{run}.db")), lambda: None
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore

    schema = f"chongming_options_{os.getpid()}_{run}"
    store = PostgresTaskStore(where, schema=schema)
    store.create_schema()

    def drop() -> None:
        with psycopg.connect(where, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())

    return store, drop


def _rate(
    place: tuple[str, str],
    n: int,
    kind: str,
    seq: list[int],
    counts: list[tuple[int, int]] | None = None,
) -> float:
    """Tasks/s of ``n`` submits of ``kind`` on a fresh store; ``counts`` gets a SQLite
    store's group commits and their writes (the first task's included)."""
    seq[0] += 1
    store, drop = _fresh(place, seq[0])
    node = Controller(store, max_workers=WORKERS)
    node.task(_noop, name="noop")
    node.tasks["noop"].submit().wait(10)
    submit: Callable[[int], Any]
    if kind == "plain":
        submit = lambda i: node.tasks["noop"].submit()  # noqa: E731
    elif kind == "priority":
        prioritised = node.tasks["noop"].configure(priority=1)
        submit = lambda i: prioritised.submit()  # noqa: E731
    else:
        submit = lambda i: node.tasks["noop"].configure(dedupe_key=f"k{i}").submit()  # noqa: E731
    started = time.perf_counter()
    runs = [submit(i) for i in range(n)]
    for run in runs:
        run.wait(60)
    took = time.perf_counter() - started
    node.close()
    if counts is not None:
        counts.append(_commits(store))
    store.close()
    drop()
    return n / took


def options_rows(tasks: int, rounds: int, dsn: str | None, tmp: Path) -> None:
    places = [("memory", ""), ("SQLite", str(tmp))] + ([("PostgreSQL", dsn)] if dsn else [])
    seq = [0]
    print(
        f"{tasks} no-op tasks a run, one by one, {WORKERS} workers, {rounds} rounds, each run "
        "on an empty store; tasks/s"
    )
    for place in places:
        name = place[0]
        contenders = {
            kind: functools.partial(_rate, place, tasks, kind, seq)
            for kind in ("plain", "priority", "dedupe")
        }
        rates = in_rounds(contenders, rounds)
        for kind, values in rates.items():
            print(f"  {name:<11} {kind:<9} " + "  ".join(f"{x:>8,.0f}" for x in values))
        for kind in ("priority", "dedupe"):
            each = [o / p for o, p in zip(rates[kind], rates["plain"], strict=True)]
            print(
                f"  {name:<11} {kind} / plain: {statistics.median(each):.2f}x "
                f"(rounds {' '.join(f'{x:.2f}' for x in each)}; target 0.91x)"
            )
        if name == "SQLite":
            for kind in ("plain", "priority", "dedupe"):
                counts: list[tuple[int, int]] = []
                _rate(place, 2000, kind, seq, counts)
                ((commits, writes),) = counts
                print(
                    f"  SQLite      {kind:<9} {commits / 2001:.2f} group commits "
                    f"a task, {writes / max(1, commits):.2f} writes a commit"
                )


def shared_commits(dsn: str, tasks: int, threads: int) -> None:
    """``threads`` threads submitting at once, as a web service's request handlers do,
    against one thread submitting the same number: tasks/s, and the database's commits a
    task (``pg_stat_database``, its own connections' included)."""
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore

    schema = f"chongming_shared_{os.getpid()}"
    made = PostgresTaskStore(dsn, schema=schema)
    made.create_schema()
    made.close()

    def one(submitters: int) -> tuple[float, float]:
        store = PostgresTaskStore(dsn, schema=schema)
        node = Controller(store, max_workers=WORKERS)
        node.task(_noop, name="noop")
        node.tasks["noop"].submit().wait(10)
        each = tasks // submitters
        runs: list[Any] = []

        def submit() -> None:
            mine = [node.tasks["noop"].submit() for _ in range(each)]
            runs.extend(mine)

        before = database_writes(dsn)[0]
        started = time.perf_counter()
        pool = [threading.Thread(target=submit) for _ in range(submitters)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        for run in runs:
            run.wait(120)
        took = time.perf_counter() - started
        node.close()
        store.close()
        time.sleep(0.6)  # the statistics collector's flush
        return len(runs) / took, (database_writes(dsn)[0] - before) / len(runs)

    try:
        print(f"PostgreSQL, {tasks} no-op tasks submitted and run, {WORKERS} workers:")
        for submitters in (1, threads):
            rate, per = one(submitters)
            print(
                f"  {submitters:>2} submitting threads: {rate:>7,.0f} tasks/s, "
                f"{per:.2f} commits a task"
            )
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())


def _cpu_over(seconds: float) -> float:
    before = time.process_time()
    time.sleep(seconds)
    return time.process_time() - before


def delayed_rows(count: int, spread: float, tmp: Path) -> None:
    idle_store = open_store(str(tmp / "idle.db"))
    with Controller(idle_store, max_workers=WORKERS) as idle:
        idle.task(_noop, name="noop")
        idle.tasks["noop"].submit().wait(10)
        idle_cpu = _cpu_over(2.0)
    idle_store.close()

    started: dict[str, float] = {}
    lock = threading.Lock()

    def note(token: CancellationToken) -> None:
        now = time.time()
        with lock:
            started[current_id()] = now

    store = open_store(str(tmp / "delayed.db"))
    with Controller(store, max_workers=WORKERS) as node:
        node.task(note, name="note")
        node.tasks["note"].submit().wait(10)
        # After the submits: about 15,000 a second in batches of ten.
        first = datetime.now(UTC) + timedelta(seconds=3 + count / 15_000)
        calls = [() for _ in range(count)]
        made = time.perf_counter()
        # Ten tasks a run-at time (one commit each batch): a burst of ten is what the
        # workers take at once, so the lateness is the timer's and not a queue's.
        per = 10
        runs = []
        for k in range(0, count, per):
            at = first + timedelta(seconds=spread * k / count)
            runs += node.tasks["note"].configure(run_at=at).submit_many(calls[k : k + per])
        submitted = time.perf_counter() - made
        wait_left = (first - datetime.now(UTC)).total_seconds()
        waiting_cpu = _cpu_over(min(2.0, max(0.0, wait_left - 0.5)))
        for run in runs:
            run.wait(spread + 120)
        late = []
        for run in runs:
            run_at = store.get(run.task_id).run_at  # type: ignore[union-attr]
            late.append(started[run.task_id] - run_at.timestamp())  # type: ignore[union-attr]
    store.close()
    ms = [x * 1000 for x in late]
    print(
        f"{count:,} delayed tasks over {spread:.0f} s (SQLite, {WORKERS} workers; submitted "
        f"in {submitted:.1f} s): lateness p50 {statistics.median(ms):.1f} ms, p99 "
        f"{percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms (target p99 50 ms)"
    )
    print(
        f"CPU over 2 s while they wait: {waiting_cpu * 1000:.0f} ms; an idle node with none "
        f"waiting: {idle_cpu * 1000:.0f} ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dsn", default=None)
    p.add_argument("--delayed", type=int, default=100_000)
    p.add_argument("--spread", type=float, default=60.0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chongming-options-") as tmp:
        options_rows(a.tasks, a.rounds, a.dsn, Path(tmp))
        if a.dsn:
            shared_commits(a.dsn, a.tasks, 8)
        if a.delayed:
            delayed_rows(a.delayed, a.spread, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
