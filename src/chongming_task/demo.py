"""The demo node: sample tasks with progress on the embedded SQLite store.

    python -m chongming_task.demo                 # run a node with sample tasks
    python -m chongming_task.demo ps              # from a second terminal: list tasks
    python -m chongming_task.demo pause TASK_ID   # ... or stop / resume / cancel one

The second terminal is another process: its control calls become commands in the store,
which the demo node picks up within half a second.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

from .controller import Controller
from .errors import ChongmingTaskError
from .model import Progress, TaskQuery, TaskSnapshot
from .policies import RetryPolicy
from .token import CancellationToken

DEFAULT_DB = "chongming-demo.db"


def _bar(snapshot: TaskSnapshot, width: int = 20) -> str:
    fraction = snapshot.progress.fraction if snapshot.progress else None
    if fraction is None:
        return " " * (width + 7)
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%}"


def render(snapshots: list[TaskSnapshot]) -> str:
    lines = [f"{'TASK ID':32}  {'NAME':10} {'STATUS':10} {'TRY':>3}  PROGRESS"]
    for s in snapshots:
        note = s.progress.message if s.progress and s.progress.message else ""
        if s.failure and s.is_terminal:
            note = s.failure.message
        lines.append(
            f"{s.task_id:32}  {s.name:10} {s.status.value:10} {s.attempt:>3}  {_bar(s)} {note}"
        )
    return "\n".join(lines)


def _define(node: Controller) -> None:
    @node.task(name="ingest", tags={"io"})
    def ingest(token: CancellationToken, rows: int) -> dict[str, int]:
        for done in range(rows + 1):
            token.checkpoint(Progress(current=done, total=rows, message=f"{done}/{rows} rows"))
            token.sleep(0.25)
        return {"rows": rows}

    @node.task(name="report")
    def report(token: CancellationToken, pages: int) -> str:
        for page in range(1, pages + 1):
            token.checkpoint(Progress(current=page, total=pages, message=f"page {page}"))
            token.sleep(0.5)
        return f"{pages} pages"

    attempts: dict[str, int] = {}

    @node.task(name="flaky", retries=3, backoff=RetryPolicy(base_delay=1.0))
    def flaky(token: CancellationToken, fail_times: int) -> str:
        seen = attempts[token.task_id] = attempts.get(token.task_id, 0) + 1
        token.checkpoint(Progress(current=seen, total=fail_times + 1, message=f"try {seen}"))
        token.sleep(1.0)
        if seen <= fail_times:
            raise ConnectionError(f"upstream unavailable (try {seen})")
        return "recovered"


def run_node(db: str, duration: float) -> int:
    node = Controller(db, owner="demo-node")
    _define(node)
    runs = [
        node.submit("ingest", 60),
        node.submit("ingest", 100),
        node.submit("report", 30),
        node.submit("flaky", 2),
    ]
    interrupted = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        interrupted.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    me = f"{sys.executable} -m chongming_task.demo --db {db}"
    print(f"demo node {node.owner} running {len(runs)} tasks in {db}")
    print(f"from another terminal:  {me} ps   |   {me} pause|resume|stop TASK_ID")
    print("Ctrl-C stops the tasks and exits; their state stays in the database.\n")
    deadline = time.monotonic() + duration
    while not interrupted.wait(1.0):
        snapshots = [r.snapshot() for r in runs]
        print(render(snapshots), end="\n\n", flush=True)
        if all(s.is_terminal for s in snapshots) or time.monotonic() > deadline:
            break
    node.close()
    print(render([r.snapshot() for r in runs]))
    print("\nstopped by Ctrl-C; tasks stopped and persisted." if interrupted.is_set() else "")
    return 0


def control(db: str, verb: str, task_id: str | None) -> int:
    console = Controller(db, owner="demo-console")
    try:
        if verb == "ps":
            print(render(console.list_tasks(TaskQuery(newest_first=True, limit=20))))
            return 0
        assert task_id is not None
        receipt = getattr(console, verb)(task_id)
        if receipt.accepted:
            print(f"{verb} {task_id}: request accepted (the node acts at its next poll)")
        else:
            print(f"{verb} {task_id}: {receipt.outcome}")
        return 0
    except ChongmingTaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        console.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chongming_task.demo", description=__doc__)
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite file (default {DEFAULT_DB})")
    parser.add_argument("--duration", type=float, default=120.0, help="stop after N seconds")
    parser.add_argument("verb", nargs="?", choices=["ps", "stop", "pause", "resume", "cancel"])
    parser.add_argument("task_id", nargs="?")
    args = parser.parse_args(argv)
    if args.verb is None:
        return run_node(args.db, args.duration)
    if args.verb != "ps" and not args.task_id:
        parser.error(f"{args.verb} needs a TASK_ID")
    return control(args.db, args.verb, args.task_id)


if __name__ == "__main__":
    sys.exit(main())
