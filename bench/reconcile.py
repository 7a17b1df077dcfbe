"""``reconcile()`` over many non-terminal tasks whose supervisor is gone.

    uv run python bench/reconcile.py [--tasks N]

Fills a SQLite file with N running tasks whose lease expired (a node died), then times a
dry run and a real reconcile that marks every one ``lost``. The reference, in the same
run, is the floor for the work: one raw ``UPDATE`` of all those rows in a single statement
(what the store would do if the judgement moved into SQL).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import Controller, SqliteTaskStore, TaskSnapshot, TaskStatus


def fill(path: Path, tasks: int) -> None:
    store = SqliteTaskStore(path)
    past = datetime.now(UTC) - timedelta(hours=1)
    with store.atomic():
        for i in range(tasks):
            store.create(
                TaskSnapshot(
                    task_id=f"t{i:08d}",
                    name="job",
                    status=TaskStatus.RUNNING,
                    status_version=3,
                    created_at=past,
                    bucket=i % 64,
                    bucket_key=f"k{i}",
                    owner="dead-node",
                    lease_owner="dead-node",
                    lease_until=past + timedelta(seconds=30),
                )
            )
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref_path, path = Path(tmp) / "ref.db", Path(tmp) / "bench.db"
        fill(ref_path, args.tasks)
        fill(path, args.tasks)

        conn = sqlite3.connect(ref_path)
        start = time.perf_counter()
        with conn:
            conn.execute(
                "UPDATE tasks SET status = 'lost', status_version = status_version + 1 "
                "WHERE status IN ('running') AND lease_until <= ?",
                (datetime.now(UTC).isoformat(),),
            )
        reference = time.perf_counter() - start
        conn.close()

        controller = Controller(SqliteTaskStore(path), owner="survivor")
        start = time.perf_counter()
        dry = controller.reconcile(dry_run=True)
        dry_time = time.perf_counter() - start
        start = time.perf_counter()
        report = controller.reconcile()
        real_time = time.perf_counter() - start
        counts = controller.stats()
        controller.close()
        controller.store.close()
    assert len(dry.lost) == args.tasks and len(report.lost) == args.tasks
    assert counts[TaskStatus.LOST] == args.tasks
    print(f"reconcile over {args.tasks:,} non-terminal tasks with expired leases (SQLite file)")
    print(f"{'contender':44} {'seconds':>8}")
    print(f"{'one raw UPDATE statement (reference)':44} {reference:8.2f}")
    print(f"{'Controller.reconcile(dry_run=True)':44} {dry_time:8.2f}")
    print(f"{'Controller.reconcile() (marks all lost)':44} {real_time:8.2f}")


if __name__ == "__main__":
    main()
