"""bench/throughput.py's rows for an earlier commit and for this tree, side by side.

    uv run python bench/throughput_then_now.py --then REV [--tasks N] [--rounds R]
        [--dsn DSN [--pg-tasks N]]

The VM's speed drifts by tens of per cent over minutes: the same code has measured
5,696 and 8,607 per-call SQLite tasks/s on one day, so a rate read alone says as much
about the moment as about the code. This runs bench/throughput.py's own
``run_controller`` (the same no-op tasks, workers and timing from the first submit to
the last task's end) for the package at ``--then`` (its ``src/``, taken from this
checkout's history with ``git archive``) and for this tree: in memory per call, SQLite
per call, and SQLite ``submit_many``; with ``--dsn``, also bench/postgres_throughput.py's
own ``run_chongming`` on that server (a fresh database each run, ``--pg-tasks`` jobs,
prefilled and as you go: its rate over the whole window, the jobs' completions seen in
the database). Each run is a fresh process of this interpreter
(the bench checks which package it imported); every contender runs once a round, the
order turning. It prints each round's rates and the ratio of now to then, with their
median, read against ``--floor`` (default 0.90: no row more than 10 % slower than the
earlier code).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

from _stats import in_rounds  # bench/ is on sys.path when run as a script

BENCH = Path(__file__).resolve().parent
NOW = BENCH.parent / "src"
MODES = ("memory per-call", "per-call", "submit_many")
PG_MODES = ("postgres prefilled", "postgres as you go")
BATCH = 100  # as bench/throughput.py's default


def child(mode: str, tasks: int, workers: int, folder: str) -> None:
    """One run in this process, of whichever ``chongming_task`` PYTHONPATH gives; for a
    PostgreSQL mode, ``folder`` is the server's DSN."""
    import chongming_task

    if mode in PG_MODES:
        from postgres_throughput import run_chongming

        result = run_chongming(folder, tasks, workers, mode.removeprefix("postgres "))
        print(json.dumps({"rate": tasks / result.seconds, "module": chongming_task.__file__}))
        return
    from throughput import run_controller

    path = Path(folder) / f"{mode.replace(' ', '-')}-{os.getpid()}.db"
    batch = BATCH if mode == "submit_many" else 0
    make = (
        chongming_task.InMemoryTaskStore
        if mode.startswith("memory")
        else lambda: chongming_task.SqliteTaskStore(path)
    )
    seconds = run_controller(tasks, workers, make, batch)
    print(json.dumps({"rate": tasks / seconds, "module": chongming_task.__file__}))


def extract(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` from this checkout's history, written under ``into``."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(BENCH.parent), "archive", "--format=tar", rev, "src"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        sys.exit(f"cannot read {rev} from this checkout's history: {detail.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        # This repository's own archive; the filter where the interpreter has it (3.11.4+).
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, **safe)  # type: ignore[arg-type]
    return into / "src"


def measure(src: Path, mode: str, tasks: int, workers: int, folder: str) -> float:
    """The rate of one run of ``mode`` with the package under ``src``, in a fresh process."""
    args = [sys.executable, __file__, "--child", mode, "--tasks", str(tasks)]
    args += ["--workers", str(workers), "--folder", folder]
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    found = json.loads(out.splitlines()[-1])
    # PYTHONPATH comes before the environment's own install of the package: check it did.
    assert Path(found["module"]).resolve().is_relative_to(src.resolve()), found["module"]
    return float(found["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--then", help="the earlier commit (required)")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--floor", type=float, default=0.90, help="the lowest median ratio")
    parser.add_argument("--dsn", help="a PostgreSQL server: its rows too")
    parser.add_argument("--pg-tasks", type=int, default=4000, help="jobs a PostgreSQL run")
    parser.add_argument("--child", choices=MODES + PG_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tasks, args.workers, args.folder)
        return
    if args.then is None:
        parser.error("--then REV is required: the commit to measure this tree against")
    with tempfile.TemporaryDirectory() as tmp:
        then = extract(args.then, Path(tmp) / "then")
        trees = {f"then ({args.then})": then, "now (this tree)": NOW}

        modes = MODES + (PG_MODES if args.dsn else ())

        def run(src: Path, mode: str) -> Callable[[], float]:
            if mode in PG_MODES:
                return lambda: measure(src, mode, args.pg_tasks, args.workers, args.dsn)
            return lambda: measure(src, mode, args.tasks, args.workers, tmp)

        contenders = {
            f"{mode}, {label}": run(src, mode) for mode in modes for label, src in trees.items()
        }
        rates = in_rounds(contenders, args.rounds)
    print(
        f"{args.tasks} no-op tasks a run ({args.pg_tasks} on PostgreSQL), {args.workers} "
        f"workers, {args.rounds} rounds (each runs every contender once, the order "
        "turning); tasks/s of each round"
    )
    for name, runs in rates.items():
        print(f"{name:40} {' '.join(f'{rate:7,.0f}' for rate in runs)}")
    for mode in modes:
        earlier, now = (rates[f"{mode}, {label}"] for label in trees)
        ratios = [ours / theirs for ours, theirs in zip(now, earlier, strict=True)]
        median = statistics.median(ratios)
        verdict = "met" if median >= args.floor else "NOT met"
        print(
            f"{mode}: now / then each round {' '.join(f'{r:.2f}x' for r in ratios)}, "
            f"median {median:.2f}x (floor {args.floor:.2f}x: {verdict})"
        )


if __name__ == "__main__":
    main()
