"""Instructions a no-op task's whole life takes in the runtime, every thread counted by
callgrind, beside ``ThreadPoolExecutor`` doing the same no-op: the in-memory row of
``bench/throughput.py`` as a count that does not drift with the VM (its wall time drifts
by +-40 % between identical runs).

    uv run python bench/throughput.py                 # the rates: what the target is read on
    uv run python bench/runtime_instructions.py [--tasks N]

Each contender runs in a child under ``valgrind --tool=callgrind`` twice, with N/3 and
then N tasks; the difference, divided by the tasks between, is what a task costs, without
start-up. Both contenders are timed alike: submit every task, wait for every one, then
leave at once (``os._exit``), so neither pays for its shutdown or the interpreter's.
Under the GIL a no-op task is bound by its interpreter work, so the pool's count over the
runtime's is near the ratio of their rates (valgrind runs one thread at a time, so the
count holds nothing of thread hand-offs or caches: read it beside the rates, not
instead of them). The pool's count moves by up to ~8 % from run to run (valgrind's
thread scheduling changes how often its workers block and wake), the runtime's by ~1 %:
to compare two versions of the runtime, compare its count, not the ratio; run this
with each (a worktree by ``PYTHONPATH``). Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _stats import callgrind_instructions  # bench/ is on sys.path when run as a script

_CONTENDERS = ("ThreadPoolExecutor (reference)", "Controller + InMemoryTaskStore")
_WORKERS = 4


def noop() -> None:
    return None


def _run(contender: str, tasks: int) -> None:
    """In the child, under callgrind: ``tasks`` no-op tasks, then leave at once."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from chongming_task import CancellationToken, Controller, InMemoryTaskStore

    def noop_task(token: CancellationToken) -> None:
        return None

    if contender == _CONTENDERS[0]:
        pool = ThreadPoolExecutor(max_workers=_WORKERS)
        wait([pool.submit(noop) for _ in range(tasks)])
    else:
        controller = Controller(InMemoryTaskStore(), max_workers=_WORKERS)
        job = controller.task(name="noop")(noop_task)
        runs = [controller.submit(job) for _ in range(tasks)]
        for run in runs:
            run.wait(600)
        assert all(run.status.value == "succeeded" for run in runs)
    sys.stdout.flush()
    os._exit(0)  # no shutdown, no finalization: outside the timed region in throughput.py


def _instructions(contender: str, tasks: int, out: Path) -> int:
    args = ["--contender", contender, "--tasks", str(tasks)]
    return callgrind_instructions(__file__, args, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--contender", choices=_CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender is not None:
        _run(args.contender, args.tasks)
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench/runtime_instructions.py: needs valgrind (apt-get install valgrind)")
    few = args.tasks // 3
    print(
        f"instructions a no-op task's life (callgrind, every thread), {_WORKERS} workers, "
        f"{few} and {args.tasks} tasks, the difference a task"
    )
    per_task = {}
    with tempfile.TemporaryDirectory() as tmp:
        for contender in _CONTENDERS:
            counts = [
                _instructions(contender, n, Path(tmp) / f"{n}.out") for n in (few, args.tasks)
            ]
            per_task[contender] = (counts[1] - counts[0]) // (args.tasks - few)
    reference = per_task[_CONTENDERS[0]]
    for contender, count in per_task.items():
        print(f"  {contender:32} {count:>9,}   pool / this {reference / count:6.1%}")


if __name__ == "__main__":
    main()
