"""Pruning by age on a store of a million tasks, while a node writes.

    uv run python bench/retention.py [--tasks 1000000] [--old 900000] [--dsn DSN]

For SQLite (a file) and, with ``--dsn``, PostgreSQL (a fresh schema, dropped afterwards),
the store is filled with ``--tasks`` tasks, ``--old`` of them finished ten days ago and
the rest finished an hour ago, each with the two trail rows of its life (created,
ended). The fill is raw SQL and not measured. Then a node (a ``Controller`` in this
process) submits a no-op task every 5 ms and waits for none; each ``submit`` is timed:
its create is a write that waits for whatever holds the store.

* **reference**: 20 s of that stream with nothing else going on;
* **prune**: the same stream while ``chongming-task prune --older-than 7d`` runs in
  another process and deletes the ``--old`` tasks in batches (its wall time and rate);
* **retention**: the same stream while the node's own ``retention`` loop deletes them
  (a fresh fill each).

Target: no write of the node held up for more than 100 ms while pruning (the max
submit), beside the reference's max; the pruned count must equal ``--old``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _stats import percentile  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, TaskSnapshot, TaskStatus
from chongming_task.model import Transition
from chongming_task.stores import codec
from chongming_task.stores.capabilities import Capabilities
from scale import Target, postgres_target, sqlite_target

NOW = datetime.now(UTC)
EVERY = 0.005
WINDOW = 20.0


def _rows(tasks: int, old: int) -> Iterator[tuple[list[Any], list[list[Any]]]]:
    for i in range(tasks):
        ended = NOW - (timedelta(days=10) if i < old else timedelta(hours=1))
        ended += timedelta(milliseconds=i)
        snapshot = TaskSnapshot(
            task_id=f"r{i:09d}",
            name=f"job-{i % 10}",
            status=TaskStatus.SUCCEEDED,
            status_version=4,
            created_at=ended - timedelta(seconds=2),
            started_at=ended - timedelta(seconds=1),
            ended_at=ended,
            bucket=i % 64,
            owner="node-a",
        )
        trail = [
            codec.transition_to_values(
                Transition(
                    task_id=snapshot.task_id,
                    version=version,
                    from_status=before,
                    to_status=after,
                    at=at,
                )
            )
            for version, before, after, at in (
                (1, None, TaskStatus.QUEUED, snapshot.created_at),
                (4, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, ended),
            )
        ]
        yield codec.snapshot_to_values(snapshot), trail


def fill(target: Target, tasks: int, old: int) -> None:
    rows: list[list[Any]] = []
    trails: list[list[Any]] = []
    for row, trail in _rows(tasks, old):
        rows.append(row)
        trails += trail
        if len(rows) == 20_000:
            target.insert_rows(rows, trails)
            rows, trails = [], []
    if rows:
        target.insert_rows(rows, trails)
    target.analyze()


def _noop(token: CancellationToken) -> None:
    return None


def stream(node: Controller, until: Callable[[], bool], minimum: float) -> list[float]:
    """Submit a no-op every ``EVERY`` seconds until ``until()`` (and ``minimum`` seconds
    have passed); each submit's seconds."""
    took: list[float] = []
    started = time.perf_counter()
    next_at = started
    while not until() or time.perf_counter() - started < minimum:
        begin = time.perf_counter()
        node.tasks["noop"].submit()
        took.append(time.perf_counter() - begin)
        next_at += EVERY
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return took


def _watch_gone(target: Target, gone: threading.Event) -> None:
    """Set ``gone`` once no task that ended over 7 days ago is left (a look a second, on
    a store of its own)."""
    store = target.open()
    try:
        retention = Capabilities(store).prune_by_age
        while retention.count_ended(before=datetime.now(UTC) - timedelta(days=7)):
            time.sleep(1.0)
    finally:
        store.close()
    gone.set()


def line(label: str, took: list[float], extra: str = "") -> str:
    ms = [t * 1000 for t in took]
    return (
        f"  {label:<10} {len(ms):>6} writes  p50 {percentile(ms, 50):6.2f} ms  "
        f"p99 {percentile(ms, 99):7.2f} ms  max {max(ms):7.2f} ms{extra}"
    )


def run(make: Callable[[], Target], tasks: int, old: int) -> None:
    results: list[str] = []
    for scenario in ("reference", "prune", "retention"):
        target = make()
        try:
            began = time.perf_counter()
            fill(target, tasks, old)
            filled = time.perf_counter() - began
            store = target.open()
            retention = {"*": timedelta(days=7)} if scenario == "retention" else None
            node = Controller(store, owner="writer", retention=retention, max_workers=4)
            node.task(_noop, name="noop")
            node.tasks["noop"].submit().wait(10)
            extra = ""
            if scenario == "reference":
                took = stream(node, lambda: True, WINDOW)
            elif scenario == "prune":
                command = [sys.executable, "-m", "chongming_task", *target.cli]
                proc = subprocess.Popen(
                    [*command, "prune", "--older-than", "7d"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                start = time.perf_counter()
                took = stream(node, lambda p=proc: p.poll() is not None, 1.0)
                wall = time.perf_counter() - start
                out, err = proc.communicate()
                extra = f"  (prune: {wall:.1f} s, {out.splitlines()[0] if out else err})"
            else:
                start = time.perf_counter()
                gone = threading.Event()
                threading.Thread(target=_watch_gone, args=(target, gone), daemon=True).start()
                took = stream(node, gone.is_set, 1.0)
                wall = time.perf_counter() - start
                extra = f"  (the node's retention: {old:,} pruned in about {wall:.0f} s)"
            left = len(store.query())
            node.close()
            store.close()
            results.append(line(scenario, took, extra) + f"; {left:,} tasks left")
            print(f"    {scenario}: filled in {filled:.0f} s", file=sys.stderr, flush=True)
        finally:
            target.drop()
    print(
        f"{target.label}, {tasks:,} tasks, {old:,} of them ended 10 days ago; a node "
        f"submitting every {EVERY * 1000:.0f} ms, each submit timed (target: max 100 ms):"
    )
    print("\n".join(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--old", type=int, default=900_000)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seq = [0]

        def sqlite() -> Target:
            seq[0] += 1
            return sqlite_target(Path(tmp) / f"retention{seq[0]}.db")

        run(sqlite, args.tasks, args.old)
    if args.dsn:

        def postgres() -> Target:
            return postgres_target(args.dsn, f"chongming_retention_{os.getpid()}")

        run(postgres, args.tasks, args.old)


if __name__ == "__main__":
    threading.excepthook = lambda hook: print(hook.exc_value, file=sys.stderr)
    main()
