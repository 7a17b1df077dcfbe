"""What random task ids cost against time-ordered ones, on SQLite.

    uv run python bench/task_ids.py [--existing N] [--tasks N] [--rounds R]

Ids were time-first (milliseconds, then random bits: inserts land at the right edge of
the primary-key B-tree) and are now random from the first digit (so an operator can type
a short prefix; inserts land anywhere in the tree). The same Controller path runs twice
per round, alternating, with only the id generator swapped: a SQLite file holding
``--existing`` finished tasks (made with the same id scheme, unmeasured), then
``--tasks`` no-op tasks submitted one by one and run by 4 workers, timed from the first
submit to the last task's end. Rows and commits per task are the same on both sides.
"""

from __future__ import annotations

import argparse
import random
import secrets
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import chongming_task.node.submission as submission
from chongming_task import CancellationToken, Controller, SqliteTaskStore, TaskSnapshot, TaskStatus
from chongming_task.model import Transition

_rng = random.Random(secrets.randbits(128))


def time_first() -> str:
    """The previous scheme: 12 hex digits of milliseconds, then 80 random bits."""
    return f"{time.time_ns() // 1_000_000:012x}{_rng.getrandbits(80):020x}"


def random_first() -> str:
    return f"{_rng.getrandbits(128):032x}"


SCHEMES: dict[str, Callable[[], str]] = {"time-first": time_first, "random": random_first}


def noop(token: CancellationToken) -> None:
    return None


def fill(store: SqliteTaskStore, existing: int, make_id: Callable[[], str]) -> None:
    now = datetime.now(UTC)
    batch = []
    for _ in range(existing):
        task_id = make_id()
        snapshot = TaskSnapshot(
            task_id=task_id,
            name="old",
            status=TaskStatus.SUCCEEDED,
            status_version=5,
            created_at=now,
        )
        batch.append(
            (
                snapshot,
                Transition(
                    task_id=task_id,
                    version=5,
                    from_status=TaskStatus.RUNNING,
                    to_status=TaskStatus.SUCCEEDED,
                    at=now,
                ),
            )
        )
        if len(batch) == 2_000:
            store.create_many(batch)
            batch = []
    if batch:
        store.create_many(batch)


def run(scheme: str, existing: int, tasks: int) -> float:
    submission.new_task_id = SCHEMES[scheme]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteTaskStore(Path(tmp) / "ids.db")
        fill(store, existing, SCHEMES[scheme])
        with Controller(store, max_workers=4) as node:
            job = node.task(noop, name="noop")
            start = time.perf_counter()
            runs = [node.submit(job) for _ in range(tasks)]
            for r in runs:
                r.wait(120)
            elapsed = time.perf_counter() - start
            assert all(r.status is TaskStatus.SUCCEEDED for r in runs)
        store.close()
    return tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--existing", type=int, default=200_000)
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in SCHEMES}
    for _ in range(args.rounds):
        for name in SCHEMES:
            results[name].append(run(name, args.existing, args.tasks))
    print(
        f"{args.tasks:,} no-op tasks submitted one by one (4 workers) into a SQLite file "
        f"holding {args.existing:,} tasks; 1 create + 4 saves + 5 trail rows per task"
    )
    for name, rates in results.items():
        shown = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"  {name:11} tasks/s per round: {shown}   best {max(rates):,.0f}")
    ratio = max(results["random"]) / max(results["time-first"])
    print(f"  random / time-first (best of each): {ratio:.2f}")


if __name__ == "__main__":
    main()
