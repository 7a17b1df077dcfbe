"""``async def`` tasks, each figure beside its reference in the same run.

    uv run python bench/async_tasks.py [--tasks N] [--rounds R] [--dsn DSN]

* **in memory**: async no-op tasks/s through a node, against a bare asyncio worker pool
  (the same number of coroutines draining an ``asyncio.Queue`` of the same no-ops;
  target: at least 50 %);
* **per store** (SQLite, and PostgreSQL with ``--dsn``): async no-op tasks/s against the
  sync path's on the same store, both submitted one by one and waited for (target: at
  least 90 %);
* **asleep**: 10,000 async tasks sleeping at once on one node: memory each above a bare
  coroutine doing the same sleep (traced allocations, target: at most 4 KB), and the
  time until all ended against their sleep (target: within 2x);
* **stop**: a stop of a task awaiting ``token.asleep(60)``, until ``stopped`` (local;
  target p99 at most 5 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from _stats import percentile  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, InMemoryTaskStore, TaskStatus
from chongming_task.stores import open_store

WORKERS = 4


async def _noop_async(token: CancellationToken) -> None:
    return None


def _noop_sync(token: CancellationToken) -> None:
    return None


def node_rate(store_at: str | None, n: int, kind: str, schema: str | None = None) -> float:
    """Tasks/s of ``n`` no-op tasks of ``kind`` through one node, from the first submit
    to the last end."""
    store = InMemoryTaskStore() if store_at is None else open_store(store_at, schema=schema)
    c = Controller(store, max_workers=WORKERS)
    c.task(name="noop")(_noop_async if kind == "async" else _noop_sync)
    c.tasks["noop"].submit().wait(10)  # warm: the loop thread and the workers are up
    started = time.perf_counter()
    runs = [c.tasks["noop"].submit() for _ in range(n)]
    for run in runs:
        run.wait(60)
    took = time.perf_counter() - started
    c.close()
    store.close()
    return n / took


def bare_pool_rate(n: int) -> float:
    """The same no-ops through ``WORKERS`` coroutines draining an ``asyncio.Queue``."""

    async def main() -> float:
        queue: asyncio.Queue[int | None] = asyncio.Queue()

        async def worker() -> None:
            while (item := await queue.get()) is not None:
                await _noop_async(None)  # type: ignore[arg-type]
                del item

        started = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(WORKERS)]
        for i in range(n):
            queue.put_nowait(i)
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.gather(*workers)
        return n / (time.perf_counter() - started)

    return asyncio.run(main())


def asleep_cost(n: int, seconds: float) -> tuple[float, float, float]:
    """(bytes a sleeping task holds above a bare coroutine, seconds until all of them
    ended, the sleep)."""

    async def bare_sleep() -> None:
        await asyncio.sleep(seconds)

    async def bare(count: int) -> int:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        tasks = [asyncio.create_task(bare_sleep()) for _ in range(count)]
        await asyncio.sleep(seconds / 4)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        await asyncio.gather(*tasks)
        return held

    bare_bytes = asyncio.run(bare(n))
    held, _ = _sleepers(n, seconds, traced=True)
    # Timed apart: tracing every allocation slows the submits several times over.
    _, took = _sleepers(n, seconds, traced=False)
    return (held - bare_bytes) / n, took, seconds


def _sleepers(n: int, seconds: float, *, traced: bool) -> tuple[int, float]:
    """``n`` tasks awaiting ``token.asleep(seconds)`` on one node: (bytes traced while
    they sleep, if ``traced``; seconds from the first submit until all ended)."""
    c = Controller(InMemoryTaskStore(), max_workers=WORKERS, max_async=n + 10)

    @c.task(name="nap")
    async def nap(token: CancellationToken) -> None:
        await token.asleep(seconds)

    c.tasks["nap"].submit().wait(10)
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    runs = [c.tasks["nap"].submit() for _ in range(n)]
    held = 0
    if traced:
        deadline = time.monotonic() + 60
        while sum(r.status is TaskStatus.RUNNING for r in runs[:: max(1, n // 100)]) < 100:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    for run in runs:
        run.wait(120)
    took = time.perf_counter() - started
    c.close()
    return held, took


def stop_latencies(samples: int) -> list[float]:
    c = Controller(InMemoryTaskStore(), max_workers=WORKERS)

    @c.task(name="long")
    async def long(token: CancellationToken) -> None:
        await token.asleep(60)

    took = []
    for _ in range(samples):
        run = c.tasks["long"].submit()
        while run.status is not TaskStatus.RUNNING:
            time.sleep(0.001)
        time.sleep(0.002)  # asleep is awaiting
        asked = time.perf_counter()
        c.stop(run.task_id)
        run.wait(10)
        took.append((time.perf_counter() - asked) * 1000)
    c.close()
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dsn", default=None)
    p.add_argument("--sleepers", type=int, default=10_000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chongming-async-") as tmp:
        rows: dict[str, list[float]] = {}
        for r in range(a.rounds):
            order = ["bare", "memory"] if r % 2 == 0 else ["memory", "bare"]
            for what in order:
                rate = (
                    bare_pool_rate(a.tasks) if what == "bare" else node_rate(None, a.tasks, "async")
                )
                rows.setdefault(what, []).append(rate)
            places = [("SQLite", str(Path(tmp) / f"r{r}.db"), None)]
            if a.dsn:
                from chongming_task.stores.postgres import PostgresTaskStore

                schema = f"chongming_async_{r}_{int(time.time())}"
                made = PostgresTaskStore(a.dsn, schema=schema)
                made.create_schema()
                made.close()
                places.append(("PostgreSQL", a.dsn, schema))
            for name, at, schema in places:
                kinds = ["sync", "async"] if r % 2 == 0 else ["async", "sync"]
                for kind in kinds:
                    rows.setdefault(f"{name} {kind}", []).append(
                        node_rate(at, a.tasks, kind, schema)
                    )
            if a.dsn:
                import psycopg

                with psycopg.connect(a.dsn, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {places[-1][2]} CASCADE".encode())
        print(f"{a.tasks} no-op tasks a run, {WORKERS} workers, {a.rounds} rounds; tasks/s")
        for name, rates in rows.items():
            print(f"  {name:<22} " + "  ".join(f"{x:>9,.0f}" for x in rates))
        ratio = [m / b for m, b in zip(rows["memory"], rows["bare"], strict=True)]
        print(
            f"in memory / bare asyncio pool: {statistics.median(ratio):.2f}x "
            f"(each round {' '.join(f'{x:.2f}' for x in ratio)}; target 0.50x)"
        )
        for name in ("SQLite", "PostgreSQL"):
            if f"{name} async" in rows:
                each = [
                    x / y for x, y in zip(rows[f"{name} async"], rows[f"{name} sync"], strict=True)
                ]
                print(
                    f"{name} async / sync: {statistics.median(each):.2f}x "
                    f"(each round {' '.join(f'{x:.2f}' for x in each)}; target 0.90x)"
                )
    extra, took, seconds = asleep_cost(a.sleepers, 2.0)
    print(
        f"{a.sleepers} tasks asleep at once: {extra:,.0f} B each above a bare coroutine "
        f"(target 4,096); all ended {took:.2f} s after the first submit, sleep {seconds:.1f} s "
        f"({took / seconds:.2f}x; target 2x)"
    )
    stops = stop_latencies(200)
    print(
        f"stop of a task awaiting asleep(60): p50 {statistics.median(stops):.2f} ms, "
        f"p99 {percentile(stops, 99):.2f} ms, max {max(stops):.2f} ms (target p99 5 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
