"""The demo node: sample tasks with progress, run by ``chongming-task demo``.

While it runs, a second terminal sees and controls its tasks through the store:
``chongming-task ps``, ``chongming-task pause TASK_ID`` (then ``resume`` / ``stop``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType

from .controller import Controller
from .model import Progress, TaskSnapshot
from .pipelines import Pipeline
from .policies import RetryPolicy
from .schedules import IntervalTrigger
from .stores.protocol import TaskStore
from .token import CancellationToken

__all__ = ["render", "run_node"]


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

    @node.task(name="etl.step")
    def etl_step(token: CancellationToken, step: str, seconds: float) -> dict[str, object]:
        ticks = int(seconds * 4)
        for i in range(1, ticks + 1):
            token.checkpoint(Progress(current=i, total=ticks, message=step))
            token.sleep(0.25)
        return {"step": step, "inputs": sorted(token.upstream)}

    @node.task(name="heartbeat")
    def heartbeat(token: CancellationToken) -> str:
        token.checkpoint(Progress(current=1, total=1, message="tick"))
        return "ok"

    attempts: dict[str, int] = {}

    @node.task(name="flaky", retries=3, backoff=RetryPolicy(base_delay=1.0))
    def flaky(token: CancellationToken, fail_times: int) -> str:
        seen = attempts[token.task_id] = attempts.get(token.task_id, 0) + 1
        token.checkpoint(Progress(current=seen, total=fail_times + 1, message=f"try {seen}"))
        token.sleep(1.0)
        if seen <= fail_times:
            raise ConnectionError(f"upstream unavailable (try {seen})")
        return "recovered"


def run_node(store: TaskStore, db: str, duration: float) -> int:
    """Run the demo node on ``store`` until its tasks finish, ``duration`` passes, or
    Ctrl-C / SIGTERM (then its tasks are stopped and their state stays stored)."""
    node = Controller(store, owner=f"demo:{os.getpid()}")
    _define(node)
    etl = Pipeline("etl")
    etl.add("extract", "etl.step", "extract", 3)
    etl.add("transform", "etl.step", "transform", 4, depends_on=["extract"])
    etl.add("load", "etl.step", "load", 2, depends_on=["transform"])
    pipeline = node.submit_pipeline(etl)
    node.schedule("heartbeat", "heartbeat", IntervalTrigger(15))
    runs = [
        node.submit("ingest", 60),
        node.submit("ingest", 100),
        node.submit("report", 30),
        node.submit("flaky", 2),
        *pipeline.nodes.values(),
    ]
    interrupted = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        interrupted.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    me = f"chongming-task --db {db}"  # the caller passes a printable form
    print(f"demo node {node.owner} running {len(runs)} tasks in {db}")
    print(f"from another terminal:  {me} ps   |   {me} watch")
    print(f"                        {me} pause|resume|stop|cancel TASK_ID")
    print(f"pipeline etl: {me} ps --all --pipeline {pipeline.pipeline_run_id}")
    print("a 'heartbeat' task fires every 15 s from a node-owned schedule")
    print("Ctrl-C stops the tasks and exits; their state stays in the database.\n", flush=True)
    deadline = time.monotonic() + duration
    while not interrupted.wait(1.0):
        snapshots = [r.snapshot() for r in runs]
        print(render(snapshots), end="\n\n", flush=True)
        if all(s.is_terminal for s in snapshots) or time.monotonic() > deadline:
            break
    node.close()
    print(render([r.snapshot() for r in runs]))
    if interrupted.is_set():
        print("\nstopped by Ctrl-C; tasks stopped and persisted.")
    return 0


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
