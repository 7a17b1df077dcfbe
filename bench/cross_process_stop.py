"""Cross-process stop latency: a stop requested in process B until ``stopped`` is in the
store, for tasks running in node process A (shared SQLite file).

    uv run python bench/cross_process_stop.py [--stops N] [--poll SECONDS]

A's tasks checkpoint every 10 ms; A polls commands every ``--poll`` seconds. Expected:
latency spread over one poll interval; the target is p99 <= poll interval + 50 ms. The
reference row is the same measurement for a stop of a task held by B itself (no command,
no poll), in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _stats import latency_row  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, SqliteTaskStore, TaskStatus

ROOT = Path(__file__).resolve().parents[1]
ROUND = 20


def wait_stopped(b: Controller, task_id: str) -> None:
    tick = threading.Event()
    while b.store.get(task_id).status is not TaskStatus.STOPPED:  # type: ignore[union-attr]
        tick.wait(0.001)


def remote(db: Path, stops: int, poll: float) -> list[float]:
    out: list[float] = []
    b = Controller(SqliteTaskStore(db), owner="bench-console")
    while len(out) < stops:
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.node",
                str(db),
                "--poll",
                str(poll),
                "--workers",
                str(ROUND),
                *["--submit", "loop"] * ROUND,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert node.stdout is not None and node.stdin is not None
        ids = []
        for line in node.stdout:
            data = json.loads(line)
            if "ready" in data:
                break
            ids.append(data["task_id"])
        for task_id in ids:
            while b.store.get(task_id).status is not TaskStatus.RUNNING:  # type: ignore[union-attr]
                time.sleep(0.005)
        for task_id in ids[: stops - len(out)]:
            time.sleep(0.0137 * (len(out) % 37))  # spread requests over the poll cycle
            start = time.perf_counter()
            assert b.stop(task_id).accepted
            wait_stopped(b, task_id)
            out.append(time.perf_counter() - start)
        node.stdin.close()
        node.wait(60)
        node.stdout.close()
    b.close()
    b.store.close()
    return out


def local(db: Path, stops: int) -> list[float]:
    store = SqliteTaskStore(db)
    b = Controller(store, owner="bench-local", max_workers=4)

    @b.task(name="loop")
    def loop(token: CancellationToken) -> None:
        while True:
            token.checkpoint()
            token.sleep(0.010)

    out = []
    for _ in range(stops):
        run = b.submit(loop)
        while run.status is not TaskStatus.RUNNING:
            time.sleep(0.001)
        start = time.perf_counter()
        b.stop(run.task_id)
        wait_stopped(b, run.task_id)
        out.append(time.perf_counter() - start)
    b.close()
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=200)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "stop of a task held here (reference)": local(Path(tmp) / "l.db", args.stops),
            f"stop across processes (poll {args.poll}s)": remote(
                Path(tmp) / "r.db", args.stops, args.poll
            ),
        }
    print(f"stop request -> 'stopped' in the store, {args.stops} stops, SQLite file")
    print(f"{'contender':40} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, values in rows.items():
        print(latency_row(name, values))
    print(f"target: p99 <= {args.poll * 1000 + 50:.0f} ms")


if __name__ == "__main__":
    main()
