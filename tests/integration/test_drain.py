"""A deploy without surprise: ``close(drain=S)`` and ``serve(drain=S)`` take no new work
and let what runs finish, then stop the rest saying why; SIGTERM to a real node process
drains it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    ControllerClosed,
    InvalidValue,
    SqliteTaskStore,
    TaskStatus,
)
from tests.conftest import Lines, wait_until

S = TaskStatus
ROOT = Path(__file__).resolve().parents[2]

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
        later = task.configure(delay=3600).submit(1.0)
        print(json.dumps([run.task_id for run in runs] + [later.task_id]), flush=True)
        print("serving", node.serve(drain=float(sys.argv[3])), flush=True)
    """
)


def _node(tmp_path: Path, seconds: float, drain: float) -> tuple[subprocess.Popen[str], Lines]:
    script = tmp_path / "node.py"
    script.write_text(NODE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "tasks.db"), str(seconds), str(drain)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    return proc, Lines(proc.stdout)


def _all_running(tmp_path: Path, task_ids: list[str]) -> SqliteTaskStore:
    """The node's store, once every one of ``task_ids`` runs."""
    store = SqliteTaskStore(tmp_path / "tasks.db")

    def running() -> bool:
        return all((s := store.get(t)) is not None and s.status is S.RUNNING for t in task_ids)

    wait_until(running, timeout=60, what="four tasks running")
    return store


def _ids(said: Lines) -> list[str]:
    said.wait_for(lambda text: "]\n" in text, timeout=120, what="the task ids")
    return list(json.loads(said.text().splitlines()[0]))


def test_sigterm_drains_a_node_its_running_tasks_finish(tmp_path: Path) -> None:
    proc, said = _node(tmp_path, 2.0, 120)
    try:
        *running, later = _ids(said)
        store = _all_running(tmp_path, running)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)  # a repeated SIGTERM (uv run passes one on) too
        assert proc.wait(120) == 0, proc.stderr.read()  # type: ignore[union-attr]
        said.wait_for(lambda text: "serving SIGTERM" in text, timeout=10, what="its end")
        assert [store.get(t).status for t in running] == [S.SUCCEEDED] * 4  # type: ignore[union-attr]
        # A task waiting for a later time cannot be run by any other node: cancelled.
        assert store.get(later).status is S.CANCELLED  # type: ignore[union-attr]
        store.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_drain_that_runs_out_stops_the_rest_saying_so(tmp_path: Path) -> None:
    proc, said = _node(tmp_path, 600.0, 0.5)
    try:
        *running, _ = _ids(said)
        store = _all_running(tmp_path, running)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0, proc.stderr.read()  # type: ignore[union-attr]
        for task_id in running:
            assert store.get(task_id).status is S.STOPPED  # type: ignore[union-attr]
            reasons = [t.reason for t in store.history(task_id)]
            assert "controller closed: its drain of 0.5 s ran out" in reasons
        store.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_draining_node_refuses_new_work_with_one_line_and_finishes_what_it_runs(
    tmp_path: Path,
) -> None:
    node = Controller(SqliteTaskStore(tmp_path / "tasks.db"), owner="draining")
    gate = threading.Event()
    task = node.task(lambda token: gate.wait(60), name="gated")
    paused = node.task(_checkpoints, name="paused")
    run = task.submit()
    held = paused.submit()
    wait_until(lambda: run.status is S.RUNNING and held.status is S.RUNNING, timeout=30)
    held.pause()
    wait_until(lambda: held.status is S.PAUSED, timeout=30, what="paused")
    closing = threading.Thread(target=node.close, kwargs={"drain": 120})
    closing.start()
    refused: list[str] = []
    before: list[object] = []  # submits that came before the drain began: they run too

    def refuses() -> bool:
        try:
            before.append(task.submit())
        except ControllerClosed as exc:
            refused.append(str(exc))
        return bool(refused)

    try:
        wait_until(refuses, timeout=30, what="the drain begun")
        assert refused == [
            "node draining is draining before it closes: it takes no new tasks while the "
            "ones it runs finish"
        ]
        assert closing.is_alive()  # waiting for the running task, not the paused one
    finally:
        gate.set()
        closing.join(60)
    assert not closing.is_alive()
    assert run.wait(10).status is S.SUCCEEDED
    assert held.wait(10).status is S.STOPPED  # a paused task is not waited for
    other = Controller(SqliteTaskStore(tmp_path / "other.db"))
    with pytest.raises(InvalidValue, match="drain must be a finite number of seconds"):
        other.close(drain=float("nan"))
    other.close()


def _checkpoints(token: CancellationToken) -> None:
    while True:
        token.sleep(0.02)
