"""Instructions a task's SQLite writes take, counted by callgrind: repeatable where wall
time is not (this VM drifts by +-40 % between identical runs).

    uv run python bench/sqlite_instructions.py [--tasks N]

Two shapes, each the rows the runtime hands the store, recorded once from a real
per-call run, then replayed on one thread through the store's group commit:

* ``per call``: each task's create and, in the same call, the previous task's life (its
  start and end, one compare-and-set with three trail rows): one statement and one
  commit a task, as a loop of ``submit`` commits them (a run's end rides the next
  create's commit);
* ``bulk create``: creates by 100 (``submit_many``'s path, straight into the tables).

Each shape runs twice under ``valgrind --tool=callgrind``, replaying N/3 and then N
tasks of the same recording; the difference, divided by the tasks between, is the
instructions a task costs, without start-up and recording. Needs valgrind. Compare two
versions of the code by running this with each (a worktree by ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

from _stats import callgrind_instructions  # bench/ is on sys.path when run as a script

_SHAPES = ("per call", "bulk create")


def _replay(recording: Path, shape: str, tasks: int) -> None:
    """In the child, under callgrind: replay ``tasks`` tasks of the recording."""
    from chongming_task import SqliteTaskStore
    from chongming_task.stores import codec
    from chongming_task.stores.sqlite import store as sqlite_store
    from chongming_task.stores.sqlite.group import WriteRequest

    writes = pickle.loads(recording.read_bytes())[:tasks]
    store = SqliteTaskStore(Path(tempfile.mkdtemp()) / "replay.db")
    try:
        if shape == "bulk create":
            creates = [create for create, _ in writes]
            for start in range(0, len(creates), 100):
                store.create_many(creates[start : start + 100])
            return
        # Encoded before the loop, as the runtime encodes before it takes the lock.
        batches = []
        previous = None
        for (snapshot, first), life in writes:
            values = codec.snapshot_to_values(snapshot) + codec.transition_to_values(first)[1:]
            batch = [WriteRequest(new=[values], trail=[])]
            if previous is not None:
                batch.append(sqlite_store._life_request(previous[0], 1, previous[1]))
            batches.append(batch)
            previous = life
        for batch in batches:
            store._group_write_all(batch)
    finally:
        store.close()


def _instructions(recording: Path, shape: str, tasks: int, out: Path) -> int:
    args = ["--replay", str(recording), "--shape", shape, "--tasks", str(tasks)]
    return callgrind_instructions(__file__, args, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=_SHAPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay is not None:
        _replay(args.replay, args.shape, args.tasks)
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench/sqlite_instructions.py: needs valgrind (apt-get install valgrind)")
    sys.path.insert(0, os.path.dirname(__file__))
    from throughput import record_writes  # bench/ is on sys.path when run as a script

    with tempfile.TemporaryDirectory() as tmp:
        recording = Path(tmp) / "writes.pickle"
        recording.write_bytes(pickle.dumps(record_writes(args.tasks, 4)))
        few = args.tasks // 3
        print(
            f"instructions a task (callgrind), {few} and {args.tasks} tasks replayed on "
            "one thread, the difference a task"
        )
        for shape in _SHAPES:
            counts = [
                _instructions(recording, shape, n, Path(tmp) / f"{n}.out")
                for n in (few, args.tasks)
            ]
            print(f"  {shape:12} {(counts[1] - counts[0]) // (args.tasks - few):>9,}")


if __name__ == "__main__":
    main()
