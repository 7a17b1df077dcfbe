"""No-op task throughput: Controller (in-memory, SQLite file) vs ThreadPoolExecutor.

    uv run python bench/throughput.py [--tasks N] [--workers W] [--repeat R]

``submit`` is one durable transaction per task; ``submit_many`` creates a batch in one
transaction (the SQLite row shows both).

Every Controller task is a full life: created, queued, starting, running, succeeded, each
transition saved and appended (with SQLite: durable in the WAL). The reference runs the
same no-op through ``concurrent.futures.ThreadPoolExecutor`` with the same worker count, in
the same process and run. ``--repeat`` rounds each run every contender once (the order
turning from round to round): a contender's best rate is reported, and each round's
ratio to the pool (runs made side by side) with their median, which the in-memory
target is read against.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from _stats import in_rounds  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, InMemoryTaskStore, SqliteTaskStore


def noop() -> None:
    return None


def noop_task(token: CancellationToken) -> None:
    return None


def run_pool(tasks: int, workers: int) -> float:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        start = time.perf_counter()
        futures = [pool.submit(noop) for _ in range(tasks)]
        wait(futures)
        return time.perf_counter() - start


def run_controller(
    tasks: int, workers: int, make_store: Callable[[], object], batch: int = 0
) -> float:
    store = make_store()
    controller = Controller(store, max_workers=workers)  # type: ignore[arg-type]
    try:
        job = controller.task(noop_task, name="noop")
        start = time.perf_counter()
        if batch:
            runs = []
            for offset in range(0, tasks, batch):
                size = min(batch, tasks - offset)
                runs += controller.submit_many(job, [()] * size)
        else:
            runs = [controller.submit(job) for _ in range(tasks)]
        for run in runs:
            run.wait(120)
        elapsed = time.perf_counter() - start
        assert all(r.status.value == "succeeded" for r in runs)
        return elapsed
    finally:
        controller.close()
        store.close()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100, help="submit_many batch size")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    counter = iter(range(1_000_000))

    def sqlite_store() -> SqliteTaskStore:
        return SqliteTaskStore(Path(tmp.name) / f"bench-{next(counter)}.db")

    contenders: dict[str, Callable[[], float]] = {
        "ThreadPoolExecutor (reference)": lambda: run_pool(args.tasks, args.workers),
        "Controller + InMemoryTaskStore": lambda: run_controller(
            args.tasks, args.workers, InMemoryTaskStore
        ),
        "Controller + SqliteTaskStore (file, WAL)": lambda: run_controller(
            args.tasks, args.workers, sqlite_store
        ),
        f"  same, submit_many by {args.batch}": lambda: run_controller(
            args.tasks, args.workers, sqlite_store, batch=args.batch
        ),
    }
    names = list(contenders)
    seconds = in_rounds(contenders, args.repeat)
    rates = {name: args.tasks / min(runs) for name, runs in seconds.items()}
    pool = seconds[names[0]]
    ratios = {
        name: [theirs / ours for ours, theirs in zip(runs, pool, strict=True)]
        for name, runs in seconds.items()
    }
    # The targets of issue 15 (before it: 25 % of the pool and 3,000/s).
    memory, per_call, many = names[1:4]
    targets: dict[str, tuple[str, bool]] = {
        memory: (">= 50% of pool", statistics.median(ratios[memory]) >= 0.5),
        per_call: (">= 6,000/s", rates[per_call] >= 6000),
        many: (">= 8,000/s", rates[many] >= 8000),
    }
    print(
        f"{args.tasks} no-op tasks, {args.workers} workers, {args.repeat} rounds (each "
        "runs every contender once, the order turning); best rate, and each round's "
        "ratio to the pool with their median"
    )
    print(f"{'contender':42} {'tasks/s':>8} {'each round vs pool':>22} {'median':>7}  target")
    for name, rate in rates.items():
        target, met = targets.get(name, ("", True))
        verdict = f"  {target}: {'met' if met else 'NOT met'}" if target else ""
        each = " ".join(f"{ratio:.1%}" for ratio in ratios[name])
        print(f"{name:42} {rate:8,.0f} {each:>22} {statistics.median(ratios[name]):7.1%}{verdict}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
