"""The process tasks bench/process_boundary.py runs, and the node program it kills: the
worker processes import these functions by module and name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chongming_task import CancellationToken, Controller, TaskStatus, current
from chongming_task.stores import open_store


def own_id(token: CancellationToken) -> str:
    """Its own task id: a result stored on another task shows at once."""
    here = current()
    assert here is not None
    return here.task_id


def scribbles(token: CancellationToken) -> str:
    """Writes bytes that are not a frame to its worker's stream (every socket it holds),
    then returns its own id as if nothing happened."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                os.write(int(fd), b"bytes that are not a frame of the wire")
        except OSError:
            continue
    time.sleep(0.05)
    return own_id(token)


def spins(token: CancellationToken, seconds: float) -> str:
    """Pure work that never reaches a checkpoint."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return own_id(token)


def starts_children(token: CancellationToken, tell: str) -> None:
    """Starts ``sleep 600`` in its own process group and in a session of its own, says
    their pids, then spins without a checkpoint."""
    kept = subprocess.Popen(["sleep", "600"])
    away = subprocess.Popen(["sleep", "600"], start_new_session=True)
    aside = f"{tell}.part"  # whole or not at all: the node reads it once it appears
    Path(aside).write_text(json.dumps([os.getpid(), kept.pid, away.pid]))
    os.replace(aside, tell)
    while True:
        pass


def _wait(run: Any, status: TaskStatus, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while run.status is not status:
        if time.monotonic() > end:
            raise SystemExit(f"{run.task_id} stayed {run.status}, not {status}")
        time.sleep(0.01)


def node(where: str, schema: str, owner: str, folder: str, results: int) -> None:
    """A node that leaves, before it says ``ready``: ``results`` tasks that return their
    own ids on workers whose streams were broken between them, a task ended by its
    timeout and one by a stop (forced ends, both), a worker suspended by a pause, and a
    task's children in and out of its process group. Then it waits to be killed."""
    store = open_store(where, schema=schema or None, create=True)
    with Controller(store, owner=owner, max_processes=3, activity_interval=0.05) as n:
        own = n.task(own_id, carrier="process", name="own")
        scribble = n.task(scribbles, carrier="process", name="scribble", retries=0)
        spin = n.task(spins, carrier="process", name="spin", timeout_grace=0.2, retries=0)
        timed = n.task(
            spins, carrier="process", name="timed", timeout=0.3, timeout_grace=0.2, retries=0
        )
        held = n.task(spins, carrier="process", name="held", suspend=True, timeout_grace=0.2)
        children = n.task(starts_children, carrier="process", name="children")
        runs = []
        for i in range(results):
            runs.append((scribble if i % 5 == 2 else own).submit())
        for run in runs:
            run.wait(120)
        timed.submit(600).wait(120)
        stopped = spin.submit(600)
        _wait(stopped, TaskStatus.RUNNING)
        time.sleep(0.1)
        stopped.stop()
        stopped.wait(120)
        suspended = held.submit(600)
        _wait(suspended, TaskStatus.RUNNING)
        time.sleep(0.1)
        suspended.pause()
        _wait(suspended, TaskStatus.PAUSED)
        tell = Path(folder) / f"{owner}.children"
        children.submit(str(tell))
        while not tell.exists():
            time.sleep(0.01)
        print(json.dumps({"ready": True, "children": json.loads(tell.read_text())}), flush=True)
        while True:
            time.sleep(60)


if __name__ == "__main__":
    node(*sys.argv[1:5], int(sys.argv[5]))
