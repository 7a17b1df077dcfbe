"""Per-call ``submit`` latency on SQLite: WAL checkpoints on a thread of the store's own
against checkpoints made by the commits themselves.

    uv run python bench/submit_latency.py [--tasks N] [--rounds R]

Both contenders do the same work: ``--tasks`` no-op tasks submitted one by one
(``Controller.submit``, 4 workers, each call returns once its create is durable), on a
new SQLite file each run. Latency is each ``submit`` call, start to return; the rate is
first submit to last task ended.

- *background checkpoints*: the store as it ships (``Checkpointer``: automatic
  checkpoints off, a thread of the store's own copies the WAL back).
- *checkpoints by commits (reference)*: the same store with SQLite's automatic
  checkpoint at 8,192 pages, as before: the commit that takes the WAL past it copies
  the pages back on its caller's thread (the store's own fallback when its thread
  cannot connect).

Rounds run each contender once, the order turning (``_stats.in_rounds``). The slowest
calls (the maximum) are mostly full collections of the garbage collector: every run's
handles are kept until the end, as a caller of ``submit`` keeps them to wait.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _stats import in_rounds, percentile  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, SqliteTaskStore
from chongming_task.stores.sqlite.schema import AUTOCHECKPOINT


def noop_task(token: CancellationToken) -> None:
    return None


def run(path: Path, tasks: int, *, by_commits: bool) -> tuple[float, list[float]]:
    """(tasks a second, each submit's seconds)."""
    store = SqliteTaskStore(path)
    if by_commits:
        checkpointer = store.checkpointer
        assert checkpointer is not None
        checkpointer.close()  # before any commit: the thread never starts
        with store.connection.read("checkpoint settings") as conn:  # as before the thread
            conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT}")
    controller = Controller(store, max_workers=4)
    try:
        job = controller.task(noop_task, name="noop")
        latencies = []
        runs = []
        start = time.perf_counter()
        for _ in range(tasks):
            began = time.perf_counter()
            runs.append(controller.submit(job))
            latencies.append(time.perf_counter() - began)
        for handle in runs:
            handle.wait(120)
        return tasks / (time.perf_counter() - start), latencies
    finally:
        controller.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    counter = iter(range(1_000_000))

    def contender(by_commits: bool) -> tuple[float, list[float]]:
        path = Path(tmp.name) / f"latency-{next(counter)}.db"
        return run(path, args.tasks, by_commits=by_commits)

    results = in_rounds(
        {
            "background checkpoints": lambda: contender(False),
            "checkpoints by commits (reference)": lambda: contender(True),
        },
        args.rounds,
    )
    print(f"{args.tasks} per-call submits a run, 4 workers, {args.rounds} rounds; submit latency")
    print(
        f"{'contender':36} {'round':>5} {'tasks/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p99.9 ms':>8} {'max ms':>7}"
    )
    for name, rounds in results.items():
        for k, (rate, seconds) in enumerate(rounds, 1):
            ms = [s * 1000 for s in seconds]
            print(
                f"{name:36} {k:5} {rate:8,.0f} {percentile(ms, 50):7.3f} {percentile(ms, 99):7.3f} "
                f"{percentile(ms, 99.9):8.2f} {max(ms):7.1f}"
            )
    tmp.cleanup()


if __name__ == "__main__":
    main()
