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

A last row prices the SQLite store alone on this machine at this moment: the same rows a
per-call run writes (each task's create, then its start and end in one compare-and-set
with three trail rows), replayed through the store's own calls on one thread with no
runtime, each call its own commit. It is not a contender: it is the ceiling the per-call
row works under (the runtime adds its threads and bookkeeping, and shares commits).

The last line prices a thread wake on this machine at this moment: what releasing a lock
costs the releasing thread when the parked thread is on the other CPU, and on its own.
On this VM the first is ~8x the second (an idle virtual CPU is woken by an interrupt
the waker pays for), and a per-call loop's submitting thread wakes a worker and hands
it the interpreter's lock each task: with every thread pinned to one CPU the per-call
row ran 12-24 % faster.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from _stats import in_rounds, wake_cost  # bench/ is on sys.path when run as a script
from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskSnapshot,
    Transition,
)
from chongming_task.stores.sqlite.store import DEFAULT_DURABILITY


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
        # The task object's own calls where the package has them (bench/
        # throughput_then_now.py also runs earlier code, where only the node's exist).
        if hasattr(job, "submit"):
            submit, submit_many = job.submit, job.submit_many
        else:
            submit = functools.partial(controller.submit, job)
            submit_many = functools.partial(controller.submit_many, job)
        start = time.perf_counter()
        if batch:
            runs = []
            for offset in range(0, tasks, batch):
                size = min(batch, tasks - offset)
                runs += submit_many([()] * size)
        else:
            runs = [submit() for _ in range(tasks)]
        for run in runs:
            run.wait(120)
        elapsed = time.perf_counter() - start
        assert all(r.status.value == "succeeded" for r in runs)
        return elapsed
    finally:
        controller.close()
        store.close()  # type: ignore[attr-defined]


Write = tuple[tuple[TaskSnapshot, Transition], tuple[TaskSnapshot, list[Transition]]]


class _Recording(InMemoryTaskStore):
    """Keeps each task's create and its last write, as the runtime hands them over."""

    def __init__(self) -> None:
        super().__init__()
        self.creates: list[tuple[TaskSnapshot, Transition]] = []
        self.lives: dict[str, tuple[TaskSnapshot, list[Transition]]] = {}

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        super().create_many(items)
        self.creates += items

    def write_transitions(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        super().write_transitions(snapshot, expect_version=expect_version, transitions=transitions)
        done = self.lives.get(snapshot.task_id, (snapshot, []))[1]
        self.lives[snapshot.task_id] = (snapshot, [*done, *transitions])


def record_writes(tasks: int, workers: int) -> list[Write]:
    """Each task's create and life, as a per-call run hands them to its store."""
    store = _Recording()
    controller = Controller(store, max_workers=workers)
    try:
        job = controller.task(noop_task, name="noop")
        for run in [controller.submit(job) for _ in range(tasks)]:
            run.wait(120)
    finally:
        controller.close()
    return [(create, store.lives[create[0].task_id]) for create in store.creates]


def run_store_alone(writes: list[Write], path: Path) -> float:
    """The recorded writes through the SQLite store's calls, one thread, one commit each."""
    store = SqliteTaskStore(path)
    try:
        start = time.perf_counter()
        for create, (snapshot, trail) in writes:
            store.create_many([create])
            store.write_transitions(snapshot, expect_version=1, transitions=trail)
        return time.perf_counter() - start
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100, help="submit_many batch size")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    other = "normal" if DEFAULT_DURABILITY == "full" else "full"
    counter = iter(range(1_000_000))

    def sqlite_store() -> SqliteTaskStore:
        return SqliteTaskStore(Path(tmp.name) / f"bench-{next(counter)}.db")

    def sqlite_other() -> SqliteTaskStore:
        return SqliteTaskStore(Path(tmp.name) / f"bench-{next(counter)}.db", durability=other)

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
    # The durability the store is not made with by default, side by side: what each
    # setting costs (docs/design.md, "What a commit survives").
    contenders[f"  same, per call, durability={other}"] = lambda: run_controller(
        args.tasks, args.workers, sqlite_other
    )
    contenders[f"  same, submit_many, durability={other}"] = lambda: run_controller(
        args.tasks, args.workers, sqlite_other, batch=args.batch
    )
    writes = record_writes(args.tasks, args.workers)
    floor = "SQLite store calls alone (see above)"
    contenders[floor] = lambda: run_store_alone(
        writes, Path(tmp.name) / f"bench-{next(counter)}.db"
    )
    names = list(contenders)
    seconds = in_rounds(contenders, args.repeat)
    rates = {name: args.tasks / min(runs) for name, runs in seconds.items()}
    pool = seconds[names[0]]
    ratios = {
        name: [theirs / ours for ours, theirs in zip(runs, pool, strict=True)]
        for name, runs in seconds.items()
    }
    # The targets (docs/benchmarks.md).
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
    each = " ".join(
        f"{alone / called:.0%}"
        for called, alone in zip(seconds[per_call], seconds[floor], strict=True)
    )
    print(
        f"per-call submit against the store calls alone, each round: {each} "
        "(the runtime's rate as a share of the SQLite writes' own)"
    )
    if not all(met for _, met in targets.values()):
        print(
            "a target is missed: bench/throughput_then_now.py --then REV runs an earlier "
            "commit beside this tree, to tell the code from the machine's moment"
        )
    wake = wake_cost()
    if wake is not None:
        print(
            f"waking a parked thread costs the waker {wake[0]:.1f} us when it is parked on "
            f"the other CPU, {wake[1]:.1f} us on the waker's own (a per-call submit loop's "
            "thread makes about two wakes a task)"
        )
    tmp.cleanup()


if __name__ == "__main__":
    main()
