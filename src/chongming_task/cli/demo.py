"""The demo node, run by ``chongming-task demo``: it keeps running until Ctrl-C, so there
is time to copy an id and try the controls from a second terminal.

What it runs: ``listen``, a task that runs until the demo ends (pause and resume it at
any time), two long ``ingest`` tasks and a ``report`` that checkpoint (pause, resume and
stop them), an ``etl`` pipeline (extract -> transform -> load) started again every
few minutes, a ``heartbeat`` schedule firing every 10 s, a ``flaky`` task that fails
twice and succeeds on its third try (fired every minute), and a ``parse`` task that
fails with a traceback (``show`` prints it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..current import current as current_task
from ..model import Progress, TaskStatus
from ..node.controller import Controller
from ..node.signals import NotedSignals
from ..pipelines import Pipeline, PipelineRun
from ..policies import RetryPolicy
from ..run.handle import TaskRun
from ..run.stored import StoredTask
from ..run.token import CancellationToken
from ..schedules import IntervalTrigger
from ..stores.protocol import TaskStore
from ..tasks import Task

__all__ = ["run_node"]

PIPELINE_EVERY = 180.0
"""Seconds between two runs of the demo's ``etl`` pipeline."""
SUMMARY_EVERY = 10.0
"""Seconds between two status lines on the demo's own terminal."""


def _define(node: Controller) -> dict[str, Task[Any]]:
    @node.task(name="ingest", tags={"io"})
    def ingest(token: CancellationToken, rows: int) -> dict[str, int]:
        for done in range(rows + 1):
            token.checkpoint(Progress(current=done, total=rows, message=f"{done}/{rows} rows"))
            token.sleep(0.25)
        return {"rows": rows}

    @node.task(name="listen", tags={"io"})
    def listen(token: CancellationToken) -> str:
        events = 0
        while True:  # until stopped: the demo's end stops it
            events += 1
            token.checkpoint(Progress(current=events, message=f"{events} events"))
            token.sleep(0.5)

    @node.task(name="report")
    def report(token: CancellationToken, pages: int) -> str:
        for page in range(1, pages + 1):
            token.checkpoint(Progress(current=page, total=pages, message=f"page {page}"))
            token.sleep(1.0)
        return f"{pages} pages"

    def step(name: str) -> None:
        @node.task(name=f"etl.{name}")
        def run_step(token: CancellationToken, seconds: float) -> dict[str, object]:
            ticks = int(seconds * 4)
            for i in range(1, ticks + 1):
                token.checkpoint(Progress(current=i, total=ticks, message=name))
                token.sleep(0.25)
            return {"step": name, "inputs": sorted(token.upstream)}

    for name in ("extract", "transform", "load"):
        step(name)

    @node.task(name="heartbeat")
    def heartbeat(token: CancellationToken) -> str:
        token.checkpoint(Progress(current=1, total=1, message="tick"))
        return "ok"

    @node.task(name="flaky", retries=3, backoff=RetryPolicy(base_delay=2.0))
    def flaky(token: CancellationToken, fail_times: int) -> str:
        here = current_task()  # which attempt this is
        seen = 1 if here is None else here.attempt
        token.checkpoint(Progress(current=seen, total=fail_times + 1, message=f"try {seen}"))
        token.sleep(1.0)
        if seen <= fail_times:
            raise ConnectionError(f"upstream unavailable (try {seen})")
        return "recovered"

    @node.task(name="parse")
    def parse(token: CancellationToken, record: dict[str, str]) -> str:
        token.checkpoint(Progress(current=0, total=1, message="reading the record"))
        token.sleep(2.0)
        return _field(record, "customer_id")  # the record has no such field: KeyError

    return {
        "ingest": ingest,
        "listen": listen,
        "report": report,
        "heartbeat": heartbeat,
        "flaky": flaky,
        "parse": parse,
    }


def _field(record: dict[str, str], key: str) -> str:
    return record[key]


def _pipeline(node: Controller) -> PipelineRun:
    etl = Pipeline("etl")
    etl.add("extract", "etl.extract", args=(20,), bucket_key="etl")
    etl.add("transform", "etl.transform", args=(30,), depends_on=["extract"], bucket_key="etl")
    etl.add("load", "etl.load", args=(15,), depends_on=["transform"], bucket_key="etl")
    return node.submit_pipeline(etl)


def _banner(
    node: Controller,
    where: str,
    command: Callable[..., str],
    runs: dict[str, TaskRun | StoredTask],
    pipeline: PipelineRun,
) -> str:
    def short(key: str) -> str:
        return runs[key].task_id[:8]

    lines = [
        f"demo node {node.owner} is running on {where}; it runs until you press Ctrl-C.",
        "",
        "In a second terminal, paste any of these:",
        f"  {command('watch')}",
        f"  {command('ps')}",
        f"  {command('ps', '--name', 'listen')}     # the task that runs until Ctrl-C",
        f"  {command('pause', short('listen'), '--wait', '5')}",
        f"  {command('resume', short('listen'), '--wait', '5')}",
        f"  {command('pause', '--name', 'ingest', '--yes')}     # every ingest task at once",
        f"  {command('stop', short('report'), '--wait', '10')}",
        f"  {command('show', short('parse'))}     # fails in ~2 s: its traceback",
        f"  {command('history', short('flaky'))}  # failed twice, retried",
        f"  {command('ps', '--all', '--pipeline', pipeline.pipeline_run_id[:8])}",
        f"  {command('schedules')}",
        f"  {command('nodes')}",
        f"  {command('web')}     # the dashboard: http://127.0.0.1:8484/",
        "",
        "Ids: any unique prefix of 6+ characters works.",
    ]
    return "\n".join(lines)


def run_node(
    store: TaskStore, where: str, command: Callable[..., str], duration: float | None = None
) -> int:
    """Run the demo node on ``store`` until Ctrl-C or SIGTERM (or ``duration`` seconds):
    its tasks are then stopped and their state stays stored. ``command`` spells a CLI
    command that works pasted into another terminal."""
    node = Controller(store, owner=f"demo:{os.getpid()}")
    tasks = _define(node)
    pipeline = _pipeline(node)
    # Bucket keys spread the tasks over the 64 buckets (the dashboard's map shows them).
    ingest = tasks["ingest"]
    runs: dict[str, TaskRun | StoredTask] = {
        "listen": tasks["listen"].configure(bucket_key="tenant-g").submit(),
        "ingest": ingest.configure(bucket_key="tenant-a").submit(1200),
        "ingest2": ingest.configure(bucket_key="tenant-b").submit(2400),
        "report": tasks["report"].configure(bucket_key="tenant-c").submit(300),
        "flaky": tasks["flaky"].configure(bucket_key="tenant-d").submit(2),
        "parse": tasks["parse"].configure(bucket_key="tenant-e").submit({"name": "Ada"}),
    }
    node.schedule("heartbeat", "heartbeat", IntervalTrigger(10), bucket_key="tenant-f")
    node.schedule(
        "flaky-every-minute", "flaky", IntervalTrigger(60), args=(2,), bucket_key="tenant-d"
    )
    with NotedSignals() as signals:
        print(_banner(node, where, command, runs, pipeline), end="\n\n", flush=True)
        started = last_summary = time.monotonic()
        next_pipeline = started + PIPELINE_EVERY
        while not signals.wait(1.0):
            now = time.monotonic()
            if now >= next_pipeline:
                _pipeline(node)
                next_pipeline = now + PIPELINE_EVERY
            if now - last_summary >= SUMMARY_EVERY:
                last_summary = now
                print(_summary(store), flush=True)
            if duration is not None and now - started >= duration:
                break
        print("stopping the demo's tasks...", flush=True)
        node.close()
    by = ["Ctrl-C" if name == "SIGINT" else name for name in signals.caught]
    print(
        f"stopped{f' by {by[0]}' if by else ''}; every task's state stays in {where}.",
        flush=True,
    )
    return 0


def _summary(store: TaskStore) -> str:
    counts = store.counts()
    shown = [f"{status.value} {counts[status]}" for status in TaskStatus if counts.get(status)]
    return f"{time.strftime('%H:%M:%S')}  tasks: {', '.join(shown) or 'none'}"


if __name__ == "__main__":
    from . import main

    sys.exit(main(["demo", *sys.argv[1:]]))
