"""Process tasks with real worker processes: results and failures that cross back, the
token across the boundary, force that ends a worker for certain, crashes named, bad
input refused where it is handed over, and no worker left behind a killed node."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import (
    ConfigurationError,
    Controller,
    FailureKind,
    IntervalTrigger,
    InvalidValue,
    Pipeline,
    SqliteTaskStore,
    TaskStatus,
    TaskStore,
)
from chongming_task.health import NodeHealth
from chongming_task.stores.postgres import PostgresTaskStore
from tests.conftest import wait_until
from tests.integration import process_tasks as tasks
from tests.integration.postgres_support import drop_schemas, made_schema, require_dsn

S = TaskStatus


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Controller]:
    with tasks.node_on(tmp_path / "tasks.db", 2) as made:
        yield made


def test_a_process_task_runs_in_a_worker_process_and_its_result_crosses_back(
    node: Controller,
) -> None:
    square = node.task(tasks.square, carrier="process", name="square")
    runs = square.submit_many([(3,), (4,), (5,)])
    results = [run.result(timeout=60) for run in runs]
    assert [r["square"] for r in results] == [9, 16, 25]  # type: ignore[index, call-overload]
    pids = {r["pid"] for r in results}  # type: ignore[index, call-overload]
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # two warm workers, reused
    assert [r["task_id"] for r in results] == [run.task_id for run in runs]  # type: ignore[index, call-overload]
    assert all(r["attempt"] == 1 for r in results)  # type: ignore[index, call-overload]


def test_progress_pause_resume_and_stop_cross_the_boundary(
    node: Controller, tmp_path: Path
) -> None:
    counted = node.task(tasks.counted, carrier="process", name="counted")
    tell = tmp_path / "pid"
    run = counted.submit(10_000, str(tell))
    wait_until(lambda: (run.progress or None) is not None, timeout=30, what="progress")
    assert run.pause().outcome == "pausing"
    wait_until(lambda: run.status is S.PAUSED, timeout=10, what="paused at a checkpoint")
    held = run.progress
    time.sleep(0.3)
    assert run.progress == held  # the child waits at its checkpoint
    run.resume()
    wait_until(lambda: run.progress != held, timeout=10, what="moving again")
    assert run.stop(reason="enough").outcome == "stopping"
    bad = node.task(tasks.bad_progress, carrier="process", name="bad-progress")
    assert bad.submit().result(timeout=60) == "refused: InvalidValue"  # raised in the task
    final = run.wait(timeout=10)
    assert final.status is S.STOPPED
    child = int(tell.read_text())
    assert tasks.alive(child)  # a stop obeyed at a checkpoint keeps its worker, warm


def test_log_records_made_in_the_child_reach_the_nodes_logging_naming_the_task(
    node: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    chatty = node.task(tasks.chatty, carrier="process", name="chatty")
    with caplog.at_level(logging.INFO):
        run = chatty.submit("acme")
        assert run.result(timeout=60) == "acme"
    said = [r for r in caplog.records if r.name == "reports"]
    assert [r.getMessage() for r in said] == [
        "rendering the report of acme",
        "a column was missing",
    ]
    assert all(getattr(r, "task_id", None) == run.task_id for r in said)
    assert all(getattr(r, "task_name", None) == "chatty" for r in said)
    assert all(getattr(r, "attempt", None) == 1 for r in said)
    assert said[0].process != os.getpid() and "KeyError: 'missing column'" in (
        said[1].exc_text or ""
    )


def test_a_failure_in_the_child_fails_the_task_with_its_traceback(node: Controller) -> None:
    boom = node.task(tasks.boom, carrier="process", name="boom")
    final = boom.submit().wait(timeout=60)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.EXCEPTION
    assert final.failure.message == "ValueError: boom in the worker process"
    assert "in its worker process" in (final.failure.traceback or "")
    local = node.task(tasks.unpicklable_error, carrier="process", name="local-error")
    final = local.submit().wait(timeout=60)
    assert final.failure is not None and "a local exception" in final.failure.message


def test_a_result_the_store_cannot_hold_fails_the_task_result_invalid(node: Controller) -> None:
    a_set = node.task(tasks.returns_a_set, carrier="process", name="a-set")
    final = a_set.submit().wait(timeout=60)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.RESULT_INVALID
    a_lock = node.task(tasks.returns_a_lock, carrier="process", name="a-lock")
    final = a_lock.submit().wait(timeout=60)  # cannot even cross back: pickling fails
    assert final.status is S.FAILED and final.failure is not None
    assert "cannot cross back" in final.failure.message


def test_a_timeout_terminates_the_worker_and_says_the_carrier_cannot_run_on(
    tmp_path: Path,
) -> None:
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"), max_processes=1, activity_interval=0.05
    ) as node:
        spin = node.task(tasks.spin, carrier="process", name="spin", timeout=0.5, timeout_grace=0.2)
        tell = tmp_path / "pid"
        final = spin.submit(60, str(tell)).wait(timeout=30)
        assert final.status is S.FAILED and final.failure is not None
        assert final.failure.kind is FailureKind.TIMEOUT and not final.failure.carrier_may_run
        # Which worker it was, from what the end says (on a loaded machine the function
        # may not have reached its first line before the timeout ended it).
        found = re.search(r"its worker process (\d+) was terminated", final.failure.message)
        assert found is not None, final.failure.message
        worker = int(found[1])
        wait_until(lambda: not tasks.alive(worker), timeout=10, what="worker gone")
        pid = node.task(tasks.pid, carrier="process", name="pid")
        assert pid.submit().result(timeout=60) != worker  # a fresh worker


def test_a_stop_of_a_task_that_never_checkpoints_ends_its_worker(
    node: Controller, tmp_path: Path
) -> None:
    spin = node.task(tasks.spin, carrier="process", name="spin", timeout_grace=0.3)
    tell = tmp_path / "pid"
    run = spin.submit(60, str(tell))
    wait_until(tell.exists, timeout=30, what="the worker started")
    started = time.monotonic()
    run.stop()
    final = run.wait(timeout=10)
    assert final.status is S.STOPPED and time.monotonic() - started < 5
    assert final.failure is None or not final.failure.carrier_may_run
    wait_until(lambda: not tasks.alive(int(tell.read_text())), timeout=10, what="worker gone")


def test_a_pause_suspends_a_task_that_never_checkpoints_and_resume_continues_it(
    node: Controller, tmp_path: Path
) -> None:
    spin = node.task(tasks.spin, carrier="process", name="spin", suspend=True, timeout_grace=0.2)
    tell = tmp_path / "pid"
    run = spin.submit(3.0, str(tell))
    wait_until(tell.exists, timeout=30, what="the worker started")
    child = int(tell.read_text())
    time.sleep(0.2)
    assert run.pause().outcome == "pausing"
    wait_until(lambda: run.status is S.PAUSED, timeout=10, what="suspended")
    assert "suspended: its worker process" in (run.history()[-1].reason or "")
    db = str(tmp_path / "tasks.db")
    shown = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", db, "show", run.task_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    said = json.loads(shown.stdout)
    assert said["carrier"] == "process" and said["status"] == "paused"
    assert said["suspended"].startswith(f"suspended: its worker process {child} stopped at ")
    before = tasks.cpu_seconds(child)
    time.sleep(0.6)
    assert tasks.cpu_seconds(child) - before < 0.05  # stopped: no CPU while paused
    run.resume()
    assert run.result(timeout=30) == "spun"  # it went on where it stood
    # It ran again after the resume (however little CPU a loaded machine gave it).
    assert tasks.cpu_seconds(child) > before

    tell.unlink()
    again = spin.submit(60, str(tell))
    wait_until(tell.exists, timeout=30, what="running again")
    time.sleep(0.2)
    again.pause()
    wait_until(lambda: again.status is S.PAUSED, timeout=10, what="suspended again")
    worker = int(tell.read_text())
    again.stop()
    final = again.wait(timeout=10)
    assert final.status is S.STOPPED
    wait_until(lambda: not tasks.alive(worker), timeout=10, what="the suspended worker gone")


def test_the_dashboards_task_page_says_the_carrier_and_the_suspended_worker(
    node: Controller, tmp_path: Path
) -> None:
    pytest.importorskip("starlette", reason="the [web] extra is not installed")
    from tests.integration.test_web import Web

    spin = node.task(tasks.spin, carrier="process", name="spin", suspend=True, timeout_grace=0.2)
    tell = tmp_path / "pid"
    run = spin.submit(60, str(tell))
    wait_until(tell.exists, timeout=30, what="the worker started")
    child = int(tell.read_text())
    web = Web(tmp_path / "tasks.db")
    try:
        status, page = web.get(f"/tasks/{run.task_id}/live")
        assert status == 200 and "process (a worker process of its node)" in page
        assert 'class="suspended"' not in page
        run.pause()
        wait_until(lambda: run.status is S.PAUSED, timeout=10, what="suspended")
        status, page = web.get(f"/tasks/{run.task_id}")
        assert status == 200
        said = f'<p class="suspended">suspended: its worker process {child} stopped at '
        assert said in page
        run.resume()
        wait_until(lambda: run.status is S.RUNNING, timeout=10, what="continued")
        assert 'class="suspended"' not in web.get(f"/tasks/{run.task_id}/live")[1]
    finally:
        web.close()
        run.stop()
    assert run.wait(timeout=10).status is S.STOPPED


def test_a_worker_that_dies_fails_its_task_crashed_and_is_retried(node: Controller) -> None:
    exits = node.task(tasks.exits, carrier="process", name="exits", retries=1)
    final = exits.submit(3).wait(timeout=60)
    assert final.status is S.FAILED and final.attempt == 2
    assert final.failure is not None and final.failure.kind is FailureKind.CRASHED
    assert "exit code 3" in final.failure.message
    killed = node.task(tasks.killed, carrier="process", name="killed")
    final = killed.submit().wait(timeout=60)
    assert final.failure is not None and "killed by SIGKILL" in final.failure.message
    square = node.task(tasks.square, carrier="process", name="square")
    assert square.submit(6).result(timeout=60)["square"] == 36  # type: ignore[index, call-overload]
    counts = node.health().processes  # written in the node's declaration: /metrics reads it
    assert counts is not None and counts.crashed == 3 and counts.started >= 4
    assert counts.busy == 0 and counts.idle >= 1
    assert NodeHealth.from_json(node.health().to_json()) == node.health()


def test_a_worker_out_of_memory_fails_its_task_and_the_node_goes_on(tmp_path: Path) -> None:
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"), max_processes=1, max_tasks_per_process=1
    ) as node:
        hungry = node.task(tasks.hungry, carrier="process", name="hungry")
        final = hungry.submit(512).wait(timeout=60)
        assert final.status is S.FAILED and final.failure is not None
        assert final.failure.kind in (FailureKind.EXCEPTION, FailureKind.CRASHED)
        assert "MemoryError" in final.failure.message or "killed" in final.failure.message
        square = node.task(tasks.square, carrier="process", name="square")
        assert square.submit(7).result(timeout=60)["square"] == 49  # type: ignore[index, call-overload]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_cli_pauses_resumes_and_stops_a_process_task_held_by_a_node(
    tmp_path: Path, kind: str
) -> None:
    where: list[str]
    if kind == "sqlite":
        db = tmp_path / "cli.db"
        store: TaskStore = SqliteTaskStore(db)
        where, dropped = ["--db", str(db)], None
    else:
        dsn = require_dsn()
        dropped = made_schema(dsn)
        store = PostgresTaskStore(dsn, schema=dropped)
        where = ["--db", dsn, "--pg-schema", dropped]
    try:
        _pause_resume_stop_from_the_cli(store, where)
    finally:
        store.close()
        if dropped is not None:
            drop_schemas(require_dsn(), [dropped])


def _pause_resume_stop_from_the_cli(store: TaskStore, where: list[str]) -> None:
    with Controller(store, max_processes=1, activity_interval=0.05) as node:
        looping = node.task(tasks.checkpoints, carrier="process", name="looping")
        run = looping.submit()
        wait_until(lambda: run.status is S.RUNNING, timeout=30, what="running")

        def cli(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "chongming_task", *where, *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        listed = json.loads(cli("ps", "--carrier", "process", "--json"))
        assert [row["task_id"] for row in listed] == [run.task_id]
        assert "process" in listed[0]["tags"]
        assert json.loads(cli("ps", "--carrier", "async", "--json")) == []
        assert "paused" in cli("pause", run.task_id, "--wait", "10")
        assert run.status is S.PAUSED
        assert "running" in cli("resume", run.task_id, "--wait", "10")
        cli("stop", run.task_id, "--wait", "10")
        assert run.wait(timeout=10).status is S.STOPPED


def test_what_cannot_cross_is_refused_where_it_is_handed_over(node: Controller) -> None:
    with pytest.raises(InvalidValue, match="a lambda"):
        node.task(lambda token: None, carrier="process", name="lam")

    def inner(token: object) -> None:
        return None

    with pytest.raises(InvalidValue, match="inside a function"):
        node.task(inner, carrier="process", name="inner")
    square = node.task(tasks.square, carrier="process", name="square")
    with pytest.raises(InvalidValue, match="cannot cross into a worker process"):
        square.submit(lambda: 1)  # type: ignore[arg-type]
    assert node.store.query() == []


@pytest.mark.parametrize("per_bucket", [None, 4], ids=["fifo", "fair"])
def test_process_tasks_waiting_for_a_worker_process_hold_no_worker_thread(
    tmp_path: Path, per_bucket: int | None
) -> None:
    gate, log = tmp_path / "gate", tmp_path / "order"
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"),
        max_workers=1,
        max_processes=1,
        max_parallel_per_bucket=per_bucket,
    ) as node:
        held = node.task(tasks.held, carrier="process", name="held")
        note = node.task(tasks.note, carrier="process", name="note")
        first = held.submit(str(gate))
        wait_until(lambda: first.status is S.RUNNING, timeout=60, what="the first running")
        low = note.submit(str(log), "low")
        high = note.configure(priority=5).submit(str(log), "high")
        # The one worker thread is free: a thread task runs while both wait for the
        # one worker process, and they wait queued, not running.
        assert node.task(lambda token: "thread", name="thread").submit().result(timeout=30) == (
            "thread"
        )
        assert (low.status, high.status) == (S.QUEUED, S.QUEUED)
        gate.touch()
        assert first.result(timeout=60) == "released"
        low.wait(60)
        high.wait(60)
        assert log.read_text().split() == ["high", "low"]


SCRIPT = """
from chongming_task import Controller


def double(token, x):
    return 2 * x


if __name__ == "__main__":
    import sys

    with Controller(sys.argv[1], max_processes=1) as node:
        print(node.task(double, carrier="process").submit(21).result(timeout=60))
"""


def test_a_scripts_own_function_runs_in_a_process_and_python_c_is_refused(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "a.db")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "42"), done.stderr
    # Code given with -c has no file a worker process could import it from.
    refused = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace('__name__ == "__main__"', "True"), "b.db"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert refused.returncode == 1
    assert "InvalidValue" in refused.stderr and "python -c" in refused.stderr
    assert "which a worker process cannot import" in refused.stderr


def test_a_module_level_task_runs_in_a_process_once_registered(node: Controller) -> None:
    cube = node.register(tasks.cube)
    assert cube.submit(3).result(timeout=60) == 27
    with pytest.raises(ConfigurationError, match="takes a plain function"):
        node.task(tasks.async_work, carrier="process", name="async")
    with pytest.raises(ConfigurationError, match="suspend=True needs carrier='process'"):
        node.task(tasks.pid, suspend=True, name="thread-suspend")
    with pytest.raises(ConfigurationError, match="carrier must be"):
        node.task(tasks.pid, carrier="fiber", name="fiber")  # type: ignore[arg-type]


def test_impossible_worker_process_settings_are_refused(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    try:
        with pytest.raises(ConfigurationError, match="max_processes must be >= 1, got 0"):
            Controller(store, max_processes=0)
        with pytest.raises(ConfigurationError, match="max_tasks_per_process must be >= 1"):
            Controller(store, max_tasks_per_process=0)
        with pytest.raises(ConfigurationError, match="max_memory_per_process must be an int"):
            Controller(store, max_memory_per_process=True)
    finally:
        store.close()


def test_workers_are_replaced_after_their_share_of_tasks(tmp_path: Path) -> None:
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"), max_processes=1, max_tasks_per_process=1
    ) as node:
        pid = node.task(tasks.pid, carrier="process", name="pid")
        seen = [pid.submit().result(timeout=60) for _ in range(3)]
        assert len(set(seen)) == 3
        counts = node.health().processes
        assert counts is not None and (counts.started, counts.replaced) == (3, 2)


def _reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_worker_that_died_while_idle_is_replaced_before_its_next_task(
    tmp_path: Path,
) -> None:
    with Controller(SqliteTaskStore(tmp_path / "t.db"), max_processes=1) as node:
        pid = node.task(tasks.pid, carrier="process", name="pid")
        first = int(pid.submit().result(timeout=60))  # type: ignore[arg-type]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: _reaped(first), timeout=10, what="the idle worker dead and reaped")
        second = pid.submit().wait(timeout=60)
        assert second.status is S.SUCCEEDED and second.attempt == 1
        assert second.outcome != first
        counts = node.health().processes
        assert counts is not None and (counts.started, counts.crashed) == (2, 0)


def test_a_worker_holding_more_than_its_memory_line_is_replaced(tmp_path: Path) -> None:
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"), max_processes=1, max_memory_per_process=200 * 2**20
    ) as node:
        hoards = node.task(tasks.hoards, carrier="process", name="hoards")
        small = [hoards.submit(1).result(timeout=60) for _ in range(2)]
        assert small[0] == small[1]  # well under the line: the same worker
        big = hoards.submit(300).result(timeout=60)
        assert big == small[0]
        after = hoards.submit(1).result(timeout=60)
        assert after != big  # the worker over the line was replaced
        wait_until(lambda: not tasks.alive(int(big)), timeout=10, what="the hoarder gone")  # type: ignore[arg-type]


def test_a_pipeline_passes_results_to_and_from_process_steps(node: Controller) -> None:
    square = node.task(tasks.square, carrier="process", name="square")
    total = node.task(tasks.total, carrier="process", name="total")
    pipe = Pipeline("sums")
    pipe.add("a", node.task(tasks.pid, carrier="process", name="pid"))
    pipe.add("b", total, depends_on=["a"])
    finals = node.submit_pipeline(pipe).wait(timeout=60)
    assert finals["b"].outcome == finals["a"].outcome
    assert square.submit(2).result(timeout=60)["square"] == 4  # type: ignore[index, call-overload]


def test_a_schedule_fires_a_process_task(tmp_path: Path) -> None:
    with Controller(
        SqliteTaskStore(tmp_path / "t.db"), max_processes=1, run_schedules=False
    ) as node:
        square = node.task(tasks.square, carrier="process", name="square")
        node.schedule("squares", square, IntervalTrigger(0.2), args=(9,))
        time.sleep(0.3)  # its first firing is due one interval after it was scheduled
        (fired,) = node.tick_schedules()
        result = fired.result(timeout=60)
        assert result["square"] == 81 and result["pid"] != os.getpid()  # type: ignore[index, call-overload]


NODE = textwrap.dedent(
    """
    import sys
    from chongming_task import Controller, SqliteTaskStore
    from tests.integration import process_tasks as tasks

    node = Controller(SqliteTaskStore(sys.argv[1]), max_processes=1)
    spin = node.task(tasks.spin, carrier="process", name="spin")
    spin.submit(600, sys.argv[2])
    node.serve()
    """
)


def test_a_killed_node_leaves_no_worker_process_behind(tmp_path: Path) -> None:
    tell = tmp_path / "pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE, str(tmp_path / "n.db"), str(tell)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
    )
    try:
        wait_until(tell.exists, timeout=60, what="the worker's pid")
        child = int(tell.read_text())
        assert tasks.alive(child)
    finally:
        proc.kill()
        proc.wait(10)
    wait_until(lambda: not tasks.alive(child), timeout=5, what="the orphan gone")
