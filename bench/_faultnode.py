"""The node process of ``bench/faults.py`` (``python bench/faults.py _node ...``) and its
handle in the campaign: looping, checkpointing and pipeline tasks, a schedule, a clock
off by a given offset, and at exit what ``result()`` told its callers."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task import CancellationToken, Controller, Pipeline, Progress
from chongming_task.clock import SystemClock
from chongming_task.policies import BucketPolicy, parse_buckets
from chongming_task.schedules import IntervalTrigger
from chongming_task.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "bench" / "faults.py"


class OffsetClock(SystemClock):
    def __init__(self, offset: float) -> None:
        self.offset = timedelta(seconds=offset)

    def now(self) -> datetime:
        return super().now() + self.offset


def node_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--schema")
    p.add_argument("--owner", required=True)
    p.add_argument("--owned", default="0-63")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--clock-offset", type=float, default=0.0)
    p.add_argument("--loops", type=int, default=0, help="looping tasks to submit")
    p.add_argument("--busy", type=int, default=0, help="checkpointing tasks, each N s")
    p.add_argument("--flows", action="store_true", help="pipelines and a 1 s schedule")
    p.add_argument("--delayed", type=int, default=0, help="tasks delayed 120 s to submit")
    p.add_argument("--finish-on", default=None, help="tasks finish once this file exists")
    p.add_argument("--tell", action="store_true", help="print what result() told, at exit")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    store = open_store(a.db, schema=a.schema)
    node = Controller(
        store,
        owner=a.owner,
        owned_buckets=parse_buckets(a.owned, 64),
        lease_ttl=a.ttl,
        activity_interval=0.05,
        command_poll_interval=0.2,
        clock=OffsetClock(a.clock_offset),
        max_workers=a.loops + a.busy + 4,  # every task it holds runs at once
    )

    def finished() -> bool:
        return a.finish_on is not None and os.path.exists(a.finish_on)

    @node.task(name="loop")
    def loop(token: CancellationToken) -> str:
        while not finished():
            token.checkpoint()
            token.sleep(0.02)
        return "finished"

    @node.task(name="busy")
    def busy(token: CancellationToken, seconds: float) -> int:
        end, step = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            step += 1
            token.checkpoint(Progress(current=step, message="x" * 200))
            token.sleep(0.01)
        return step

    @node.task(name="step")
    def step(token: CancellationToken, seconds: float) -> float:
        token.sleep(seconds)
        return seconds

    owned = parse_buckets(a.owned, 64)
    key = (
        None
        if len(owned) == 64
        else next(
            k
            for k in (f"key-{i}" for i in range(10_000))
            if BucketPolicy(64).bucket_for(k) in owned
        )
    )
    runs = [node.tasks["loop"].configure(bucket_key=key).submit() for _ in range(a.loops)]
    runs += [
        node.tasks["busy"].configure(bucket_key=key).submit(1.0 + n % 3) for n in range(a.busy)
    ]
    later = node.tasks["step"].configure(delay=120, bucket_key=key)
    runs += [later.submit(0.1) for _ in range(a.delayed)]
    for run in runs:
        print(json.dumps({"task_id": run.task_id}), flush=True)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    if a.flows:
        node.schedule("tick", "step", IntervalTrigger(seconds=1.0), args=(0.2,), bucket_key=key)
        while not stop.is_set():
            flow = Pipeline("chain")
            flow.add("a", "step", args=(0.3,), bucket_key=key)
            flow.add("b", "step", args=(0.3,), depends_on=["a"], bucket_key=key)
            flow.add("c", "step", args=(0.3,), depends_on=["b"], bucket_key=key)
            node.submit_pipeline(flow)
            stop.wait(0.4)
    else:
        stop.wait()
    # How each of its tasks ended for its callers: what result() told them.
    for run in runs if a.tell else []:
        try:
            told = f"succeeded {run.result(timeout=30)!r}"
        except Exception as exc:
            told = f"{type(exc).__name__}"
        print(json.dumps({"told": run.task_id, "said": told}), flush=True)
    node.close(timeout=10)
    store.close()
    return 0


class NodeProc:
    def __init__(self, db: str, schema: str | None, *args: str, log: Path | None = None) -> None:
        command = [sys.executable, str(FAULTS), "_node", "--db", db]
        if schema:
            command += ["--schema", schema]
        self.err = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*command, *args], stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT
        )
        self.task_ids: list[str] = []
        self.lines: list[dict[str, Any]] = []
        while True:
            assert self.proc.stdout is not None
            raw = self.proc.stdout.readline()
            if not raw:
                raise RuntimeError(f"node {args} exited early")
            line = json.loads(raw)
            if "ready" in line:
                break
            self.task_ids.append(line["task_id"])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close_log()

    def finish(self) -> list[dict[str, Any]]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            out, _ = self.proc.communicate(timeout=60)
            self.lines += [json.loads(raw) for raw in out.splitlines() if raw.strip()]
        self._close_log()
        return self.lines

    def _close_log(self) -> None:
        if self.err is not subprocess.DEVNULL:
            with contextlib.suppress(Exception):
                self.err.close()  # type: ignore[union-attr]
