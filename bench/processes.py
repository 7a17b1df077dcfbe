"""Process tasks against thread tasks and ``concurrent.futures.ProcessPoolExecutor``, in
one run, on a SQLite store:

    uv run python bench/processes.py [--tasks 8] [--seconds 0.5] [--noops 2000] [--rounds 3]

- **Cores used**: ``--tasks`` CPU-bound tasks of about ``--seconds`` each (pure Python,
  calibrated here), submitted at once and waited for: the process carrier, the thread
  carrier (4 worker threads), and a ``ProcessPoolExecutor`` of as many processes
  running the same function (``submit`` and ``result``), each the median of
  ``--rounds``. Targets: processes >= 1.8x faster than threads; >= 0.9x the executor.
- **Overhead**: ``--noops`` no-op tasks through the process carrier against the
  executor's ``submit`` + ``result`` of a no-op; target >= 0.7x.
- **Force**: a stop of a process task that never checkpoints, from the stop until the
  task is ``stopped`` in the store and its worker gone, against its ``timeout_grace``
  (target: grace + 100 ms at p99); a suspend (pause to ``paused``) and a continue
  (resume to ``running``) of such a task (target: 20 ms at p99).

- **The service stays responsive**: a Starlette endpoint served by uvicorn in the
  node's own process, asked one request at a time by a client process for
  ``--seconds-asked`` seconds: idle, then while 4 CPU-bound tasks run on the process
  carrier, then on the thread carrier; p99 latency of each (target: processes <= 2x idle).

Every contender starts its processes before its clock starts (a warm-up task each).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import _process_work as work
from _stats import percentile
from chongming_task import Controller, SqliteTaskStore, TaskStatus

WORKERS = 4


def calibrate(seconds: float) -> int:
    """Iterations of ``work.spin`` that take about ``seconds`` here, now."""
    n = 200_000
    started = time.perf_counter()
    work.spin(n)
    took = time.perf_counter() - started
    return max(1, int(n * seconds / took))


def timed_node(folder: Path, carrier: str, calls: list[tuple[int, ...]], processes: int) -> float:
    store = SqliteTaskStore(folder / f"{carrier}-{time.monotonic_ns()}.db")
    with Controller(store, max_workers=WORKERS, max_processes=processes) as node:
        task = node.task(work.burn, carrier=carrier, name="burn")  # type: ignore[arg-type]
        warm = task.submit_many([(1,)] * processes)
        for run in warm:
            run.wait(120)
        started = time.perf_counter()
        runs = task.submit_many(calls)
        for run in runs:
            assert run.wait(600).status is TaskStatus.SUCCEEDED
        return time.perf_counter() - started


def timed_executor(calls: list[tuple[int, ...]], processes: int, fn: object) -> float:
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(work.spin, [1] * processes))
        started = time.perf_counter()
        futures = [pool.submit(fn, *call) for call in calls]  # type: ignore[arg-type]
        for future in futures:
            future.result()
        return time.perf_counter() - started


def timed_noops(folder: Path, n: int, processes: int) -> float:
    store = SqliteTaskStore(folder / f"noop-{time.monotonic_ns()}.db")
    with Controller(store, max_workers=WORKERS, max_processes=processes) as node:
        task = node.task(work.noop, carrier="process", name="noop")
        for run in task.submit_many([()] * processes):
            run.wait(120)
        started = time.perf_counter()
        runs = task.submit_many([()] * n)
        for run in runs:
            assert run.wait(600).status is TaskStatus.SUCCEEDED
        return time.perf_counter() - started


def force(
    folder: Path, rounds: int, iterations: int
) -> tuple[list[float], list[float], list[float]]:
    """Stop-to-stopped beyond the grace, pause-to-paused and resume-to-running, in ms."""
    grace = 0.2
    stops, suspends, continues = [], [], []
    store = SqliteTaskStore(folder / "force.db")
    with Controller(store, max_processes=1, activity_interval=0.02) as node:
        task = node.task(
            work.never_checkpoints,
            carrier="process",
            name="spin",
            suspend=True,
            timeout_grace=grace,
        )
        for _ in range(rounds):
            run = task.submit(iterations * 100)
            while run.status is not TaskStatus.RUNNING:
                time.sleep(0.001)
            time.sleep(0.05)
            asked = time.perf_counter()
            run.pause()
            while run.status is not TaskStatus.PAUSED:
                time.sleep(0.0005)
            suspends.append((time.perf_counter() - asked - grace) * 1000)
            asked = time.perf_counter()
            run.resume()
            while run.status is not TaskStatus.RUNNING:
                time.sleep(0.0005)
            continues.append((time.perf_counter() - asked) * 1000)
            asked = time.perf_counter()
            run.stop()
            run.wait(30)
            stops.append((time.perf_counter() - asked) * 1000)
    return stops, suspends, continues


CLIENT = """
import json, sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
took = []
end = time.monotonic() + seconds
while time.monotonic() < end:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()
    took.append((time.perf_counter() - started) * 1000)
print(json.dumps(took))
"""


def responsive(folder: Path, seconds: float, iterations: int) -> dict[str, list[float]]:
    """Latencies (ms) of an endpoint in the node's process: idle, and while four
    CPU-bound tasks run on each carrier."""
    import json
    import socket
    import subprocess
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/", hello)]), port=port, log_level="error", lifespan="off"
        )
    )
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    while not server.started:
        time.sleep(0.01)

    def asked() -> list[float]:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}/", str(seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        return [float(x) for x in json.loads(done.stdout)]

    found = {"idle": asked()}
    for carrier in ("process", "thread"):
        store = SqliteTaskStore(folder / f"busy-{carrier}.db")
        with Controller(store, max_workers=WORKERS) as node:  # processes: the cores
            task = node.task(work.burn, carrier=carrier, name="burn")  # type: ignore[arg-type]
            for run in task.submit_many([(1,)] * 4):
                run.wait(120)
            runs = task.submit_many([(iterations * 40,)] * 4)
            time.sleep(0.2)
            found[carrier] = asked()
            for run in runs:
                run.stop()
            for run in runs:
                run.wait(120)
    server.should_exit = True
    serving.join(10)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--noops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--force-rounds", type=int, default=20)
    parser.add_argument("--seconds-asked", type=float, default=3.0)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    iterations = calibrate(args.seconds)
    calls = [(iterations,)] * args.tasks
    print(
        f"{args.tasks} CPU-bound tasks of ~{args.seconds} s ({iterations:,} iterations), "
        f"{cores} cores, {WORKERS} worker threads, {cores} processes; median of {args.rounds}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        proc, thread, pool = [], [], []
        for _ in range(args.rounds):
            proc.append(timed_node(folder, "process", calls, cores))
            thread.append(timed_node(folder, "thread", calls, cores))
            pool.append(timed_executor(calls, cores, work.spin))
        p, t, e = (statistics.median(x) for x in (proc, thread, pool))
        print(f"  process carrier   {p:7.2f} s   rounds {' '.join(f'{x:.2f}' for x in proc)}")
        print(f"  thread carrier    {t:7.2f} s   rounds {' '.join(f'{x:.2f}' for x in thread)}")
        print(f"  ProcessPoolExec.  {e:7.2f} s   rounds {' '.join(f'{x:.2f}' for x in pool)}")
        print(
            f"  cores used: threads / processes {t / p:.2f}x (target >= 1.8x); "
            f"executor / processes {e / p:.2f}x (target >= 0.9x)"
        )
        noop_calls = [()] * args.noops
        mine, theirs = [], []
        for _ in range(args.rounds):
            mine.append(timed_noops(folder, args.noops, cores))
            theirs.append(timed_executor(noop_calls, cores, work.plain_noop))
        m, x = statistics.median(mine), statistics.median(theirs)
        print(
            f"{args.noops} no-op tasks: process carrier {args.noops / m:,.0f}/s, executor "
            f"{args.noops / x:,.0f}/s: {x / m:.2f}x (target >= 0.7x)"
        )
        stops, suspends, continues = force(folder, args.force_rounds, iterations)
        print(
            f"force, {args.force_rounds} rounds: stop of a task that never checkpoints, "
            f"stop to stopped p99 {percentile(stops, 99):.0f} ms (grace 200 ms; target <= 300); "
            f"suspend beyond the grace p99 {percentile(suspends, 99):.1f} ms, continue p99 "
            f"{percentile(continues, 99):.1f} ms (target <= 20)"
        )
        asked = responsive(folder, args.seconds_asked, iterations)
        idle, busy, threads = (percentile(asked[k], 99) for k in ("idle", "process", "thread"))
        print(
            f"an endpoint in the node's process, p99 over {args.seconds_asked:.0f} s: idle "
            f"{idle:.1f} ms ({len(asked['idle'])} requests); 4 CPU-bound tasks on processes "
            f"{busy:.1f} ms ({busy / idle:.1f}x idle, target <= 2x), on threads "
            f"{threads:.1f} ms ({threads / idle:.1f}x)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
