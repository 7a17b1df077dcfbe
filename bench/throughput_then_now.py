"""SQLite submits, the code issue 15 measured against this tree, side by side.

    uv run python bench/throughput_then_now.py [--then REV] [--tasks N] [--rounds R]

Issue 15 set its SQLite targets as rates (per-call ``submit`` >= 6,000 durable tasks/s
and ``submit_many`` >= 8,000, where the code of its day did 3.4-4.1k and 4.3-5.7k), on a
VM whose speed drifts by tens of per cent over minutes: the same code has measured 5,696
and 8,607 per-call tasks/s on one day. A rate read alone says as much about the moment
as about the code. So this runs bench/throughput.py's own SQLite rows (its
``run_controller``: the same tasks, workers and timing from the first submit to the
last task's end) for the code the issue measured (``--then``: 6f74d8a, the last commit
before the issue's work) and for this tree, each run in a fresh process
of this interpreter, every contender once a round, the order turning, and prints each
round's ratio of now to then with their median.

The issue's targets over its own figures are 1.46-1.76x per call (6,000 over 4.1k and
3.4k) and 1.40-1.86x in bulk (8,000 over 5.7k and 4.3k). A median at or above the top
of that range says the target holds against the code it was set against, whatever the
machine is doing at that moment; the rates are printed beside it, and the absolute
line stays bench/throughput.py's.
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
THEN = "6f74d8a"  # the last commit before issue 15's work (its runtime, 2026-12-03)
# The target over the highest and the lowest rate it gave for its day; the
# verdict reads the second, the stricter.
FACTORS = {"per-call": (6000 / 4100, 6000 / 3400), "submit_many": (8000 / 5700, 8000 / 4300)}
BATCH = 100  # as bench/throughput.py's default


def child(mode: str, tasks: int, workers: int, folder: str) -> None:
    """One run in this process, of whichever ``chongming_task`` PYTHONPATH gives."""
    import chongming_task
    from throughput import run_controller

    path = Path(folder) / f"{mode}-{os.getpid()}.db"
    batch = BATCH if mode == "submit_many" else 0
    seconds = run_controller(tasks, workers, lambda: chongming_task.SqliteTaskStore(path), batch)
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
    parser.add_argument("--then", default=THEN, help="the earlier commit (default %(default)s)")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=sorted(FACTORS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tasks, args.workers, args.folder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        then = extract(args.then, Path(tmp) / "then")
        trees = {f"then ({args.then})": then, "now (this tree)": NOW}

        def run(src: Path, mode: str) -> Callable[[], float]:
            return lambda: measure(src, mode, args.tasks, args.workers, tmp)

        contenders = {
            f"{mode}, {label}": run(src, mode) for mode in FACTORS for label, src in trees.items()
        }
        rates = in_rounds(contenders, args.rounds)
    print(
        f"{args.tasks} no-op tasks a run, {args.workers} workers, SQLite file (WAL), "
        f"{args.rounds} rounds (each runs every contender once, the order turning); "
        "tasks/s of each round"
    )
    for name, runs in rates.items():
        print(f"{name:36} {' '.join(f'{rate:7,.0f}' for rate in runs)}")
    for mode, (low, high) in FACTORS.items():
        earlier, now = (rates[f"{mode}, {label}"] for label in trees)
        ratios = [ours / theirs for ours, theirs in zip(now, earlier, strict=True)]
        median = statistics.median(ratios)
        verdict = "holds" if median >= high else "does NOT hold"
        print(
            f"{mode}: now / then each round {' '.join(f'{r:.2f}x' for r in ratios)}, "
            f"median {median:.2f}x; the issue's target over its figures {low:.2f}-{high:.2f}x: "
            f"{verdict} against the code it measured"
        )


if __name__ == "__main__":
    main()
