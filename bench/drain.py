"""A deploy's SIGTERM to a node that drains: four running tasks of 2 s, ``serve(drain=10)``.

    uv run python bench/drain.py [--rounds 5] [--seconds 2] [--drain 10]

Each round starts a node process on a fresh SQLite file that submits four tasks of
``--seconds`` (each sleeping at its checkpoints) to four workers and serves with
``drain=--drain``; once all four run, it is sent SIGTERM. Printed per round: how the four
ended, and how long the process took to exit after the signal. The run fails unless every
task succeeded and every exit came within the tasks' own time left plus one second, and
within the drain plus one second. The reference is the close without a drain (the same
node, ``--drain 0``): its tasks are stopped, and it exits at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from chongming_task import SqliteTaskStore, TaskStatus

NODE = textwrap.dedent(
    """
    import json, sys
    from chongming_task import CancellationToken, Controller, SqliteTaskStore

    def report(token: CancellationToken, seconds: float) -> str:
        token.sleep(seconds)
        return "done"

    with Controller(SqliteTaskStore(sys.argv[1]), max_workers=4) as node:
        task = node.task(report, name="report")
        runs = [task.submit(float(sys.argv[2])) for _ in range(4)]
        print(json.dumps([run.task_id for run in runs]), flush=True)
        node.serve(drain=float(sys.argv[3]))
    """
)


def one(seconds: float, drain: float) -> tuple[list[str], float, float]:
    """How the four ended, the seconds from SIGTERM to exit, and from their start."""
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "drain.db"
        script = Path(folder) / "node.py"
        script.write_text(NODE)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(db), str(seconds), str(drain)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        ids = json.loads(proc.stdout.readline())
        store = SqliteTaskStore(db)
        while not all(
            (s := store.get(t)) is not None and s.status is TaskStatus.RUNNING for t in ids
        ):
            time.sleep(0.01)
        started = max(s.started_at for t in ids if (s := store.get(t)) and s.started_at)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(drain + 60)
        took = time.monotonic() - sent
        ended = [s.status.value if (s := store.get(t)) else "?" for t in ids]
        left = seconds - (time.time() - started.timestamp() - took)
        store.close()
        return ended, took, left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--drain", type=float, default=10.0)
    args = parser.parse_args()
    ok = True
    for label, drain in (("drain", args.drain), ("no drain (reference)", 0.0)):
        for n in range(args.rounds):
            ended, took, left = one(args.seconds, drain)
            line = f"{label}, round {n + 1}: {', '.join(ended)}; exit {took:.2f} s after SIGTERM"
            if drain:
                line += f" (the tasks had {left:.2f} s left)"
                good = ended == ["succeeded"] * 4 and took <= min(drain, left) + 1.0
                ok &= good
                line += "" if good else "   FAILED"
            print(line, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
