"""Shared helpers for the benchmark commands."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

R = TypeVar("R")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def database_writes(dsn: str) -> tuple[int, int]:
    """Commits and rows written (inserted, updated, deleted) so far in the database
    ``dsn`` names, from ``pg_stat_database``: a backend flushes its counts when it ends,
    or every half second while it runs."""
    import psycopg  # the Postgres benches only

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def latency_row(name: str, seconds: list[float], width: int = 40) -> str:
    ms = [v * 1000 for v in seconds]
    return f"{name:{width}} {statistics.median(ms):8.2f} {percentile(ms, 99):8.2f} {max(ms):8.2f}"


def in_rounds(contenders: Mapping[str, Callable[[], R]], rounds: int) -> dict[str, list[R]]:
    """Each contender's results, one per round; each round runs every contender once, the
    order turning from round to round. Rounds, not one contender's runs back to back:
    this VM drifts by tens of per cent over minutes, and a ratio is only fair between
    runs made side by side. Each run starts from a collected heap: what the one before
    it left for the cyclic garbage collector (a closed controller's store, say) is not
    walked again on the next contender's time."""
    names = list(contenders)
    results: dict[str, list[R]] = {name: [] for name in names}
    for k in range(rounds):
        turn = k % len(names)
        for name in names[turn:] + names[:turn]:
            gc.collect()
            results[name].append(contenders[name]())
    return results


def callgrind_instructions(script: str, args: list[str], out: Path) -> int:
    """Run ``script`` with ``args`` in this interpreter under ``valgrind --tool=callgrind``
    (its output file ``out``) and return the instructions it counted, every thread."""
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        script,
        *args,
    ]
    subprocess.run(command, check=True, capture_output=True)
    found = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
    assert found, f"no totals in {out}"
    return int(found[1])


def wake_cost(wakes: int = 2000) -> tuple[float, float] | None:
    """What waking a parked thread costs the thread that wakes it, in microseconds
    (medians): the parked thread on the other CPU, then on the waker's own; ``None``
    where threads cannot be pinned (not Linux, or one CPU).

    The waker is busy when it wakes (as a submitting thread is), so the other CPU is
    idle: on a VM the kernel must interrupt it, and that interrupt is the waker's cost.
    The submitting thread of a per-call ``submit`` loop wakes another thread about
    twice a task (the run's worker; the interpreter's lock handed to it), so this line
    says what the VM charges for that at this moment. The caller's affinity is
    restored after."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    try:
        os.sched_setaffinity(0, {allowed[0]})
        other, own = (_wake_parked(cpu, wakes) for cpu in (allowed[1], allowed[0]))
    finally:
        os.sched_setaffinity(0, set(allowed))
    return other, own


def _wake_parked(cpu: int, wakes: int) -> float:
    """Median microseconds a busy thread takes to release a lock a thread pinned to
    ``cpu`` waits on."""
    parked, back = threading.Lock(), threading.Lock()
    parked.acquire()
    back.acquire()

    def waiter() -> None:
        os.sched_setaffinity(0, {cpu})
        for _ in range(wakes):
            parked.acquire()
            back.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    took = []
    for _ in range(wakes):
        busy_until = time.perf_counter() + 50e-6  # busy while the waiter parks
        while time.perf_counter() < busy_until:
            pass
        start = time.perf_counter_ns()
        parked.release()
        took.append(time.perf_counter_ns() - start)
        if not back.acquire(timeout=10):  # the waiter is awake and about to park again
            raise RuntimeError("bench: the parked thread never woke")
    thread.join()
    return statistics.median(took) / 1000


@contextlib.contextmanager
def store_schema(dsn: str, prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL schema with the store's tables, dropped on the way out."""
    import secrets

    import psycopg

    from chongming_task.stores import open_store

    schema = f"{prefix}_{secrets.token_hex(4)}"
    made = open_store(dsn, schema=schema)
    made.create_schema()  # type: ignore[attr-defined]
    made.close()
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]
