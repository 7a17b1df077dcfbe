"""Local stop latency: ``Controller.stop()`` -> the task is ``stopped``.

    uv run python bench/stop_latency.py [--samples N] [--store memory|sqlite]

The task does 10 ms of work between checkpoints. The reference is the floor for the same
loop: a bare ``threading.Event`` checked every 10 ms, measured from ``set()`` to the loop
noticing it, in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from _stats import latency_row  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller, InMemoryTaskStore, SqliteTaskStore

WORK = 0.010


def reference(samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        stop, running, ended = threading.Event(), threading.Event(), [0.0]

        def loop(
            stop: threading.Event = stop,
            running: threading.Event = running,
            ended: list[float] = ended,
        ) -> None:
            running.set()
            while not stop.is_set():
                time.sleep(WORK)
            ended[0] = time.perf_counter()

        thread = threading.Thread(target=loop)
        thread.start()
        running.wait()
        time.sleep(WORK * 1.37)  # land anywhere inside a work slice
        t0 = time.perf_counter()
        stop.set()
        thread.join()
        out.append(ended[0] - t0)
    return out


def controller_stops(samples: int, store_kind: str) -> list[float]:
    tmp = tempfile.TemporaryDirectory()
    store = (
        InMemoryTaskStore() if store_kind == "memory" else SqliteTaskStore(Path(tmp.name) / "s.db")
    )
    controller = Controller(store, max_workers=2)
    started = threading.Event()

    @controller.task(name="worker")
    def worker(token: CancellationToken) -> None:
        started.set()
        while True:
            time.sleep(WORK)  # the work between checkpoints
            token.checkpoint()

    out = []
    try:
        for _ in range(samples):
            started.clear()
            run = controller.submit(worker)
            started.wait()
            time.sleep(WORK * 1.37)
            t0 = time.perf_counter()
            controller.stop(run.task_id)
            final = run.wait(5)
            out.append(time.perf_counter() - t0)
            assert final.status.value == "stopped"
    finally:
        controller.close()
        store.close()
        tmp.cleanup()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--store", choices=["memory", "sqlite"], default="sqlite")
    args = parser.parse_args()
    rows = {
        "threading.Event loop (reference)": reference(args.samples),
        f"Controller.stop ({args.store} store)": controller_stops(args.samples, args.store),
    }
    print(f"stop latency, task checkpoints every {WORK * 1000:.0f} ms, {args.samples} samples")
    print(f"{'contender':36} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, values in rows.items():
        print(latency_row(name, values, 36))


if __name__ == "__main__":
    main()
