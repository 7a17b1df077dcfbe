"""A program that never calls ``Controller.close()`` still exits when its main code
ends, and leaves the store true: the controller is closed at interpreter exit (running
tasks stopped, waiting ones cancelled, every transition written). Before, its service
threads kept the interpreter alive for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskStatus

NODE = textwrap.dedent(
    """
    import os, sys, threading, time, warnings
    from chongming_task import Controller, IntervalTrigger, Pipeline

    node = Controller(sys.argv[1], max_workers=int(os.environ.get("WORKERS", "1")))
    started = threading.Event()

    @node.task(name="long")
    def long(token):
        started.set()
        while True:
            token.checkpoint()
            time.sleep(0.01)
    """
)
"""A node with one worker (``WORKERS`` in the environment) and a task that runs until
it is stopped."""

PROGRAM = NODE + textwrap.dedent(
    """
    @node.task(name="quick")
    def quick(token):
        return "done"

    # Every kind of service thread running: workers, supervisor, poller, beacon,
    # scheduler (a schedule), pipeline runner (a pipeline).
    node.schedule("hourly", "quick", IntervalTrigger(3600))
    pipeline = Pipeline("one")
    pipeline.add("q", "quick")
    print("pipeline", node.submit_pipeline(pipeline).wait(30)["q"].task_id)
    long_run = node.submit(long)
    print("long", long_run.task_id)
    print("waiting", node.submit(quick).task_id, flush=True)
    assert started.wait(30)
    if sys.argv[2] == "thread":  # the program's own thread outlives its main code
        def later():
            time.sleep(0.5)
            long_run.stop(reason="done with it")  # frees the one worker
            print("later", node.submit(quick).result(30), flush=True)
        threading.Thread(target=later).start()
    print("main code ends", flush=True)
    """
)


def _exit_of(tmp_path: Path, program: str, *args: str) -> tuple[str, str]:
    """Run ``program`` on ``tmp_path/tasks.db``; it must end by itself, cleanly. Its
    standard output and error."""
    script = tmp_path / "program.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "tasks.db"), *args],
        capture_output=True,
        text=True,
        timeout=60,  # it hung for ever before
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout, done.stderr


def _run(tmp_path: Path, mode: str) -> tuple[dict[str, str], str, str]:
    stdout, stderr = _exit_of(tmp_path, PROGRAM, mode)
    ids = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    return ids, stdout, stderr


def test_a_program_that_never_closes_its_controller_exits_and_leaves_the_store_true(
    tmp_path: Path,
) -> None:
    ids, _, stderr = _run(tmp_path, "main")
    # It had a schedule: the program is told how to keep a node serving.
    assert "has schedules" in stderr and "node.serve()" in stderr, stderr
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:

        def status(task_id: str) -> TaskStatus | None:
            snapshot = store.get(task_id)
            return None if snapshot is None else snapshot.status

        assert status(ids["pipeline"]) is TaskStatus.SUCCEEDED
        assert status(ids["long"]) is TaskStatus.STOPPED
        assert [t.reason for t in store.history(ids["long"])][-2:] == [
            "controller closed",
            "stopped at a checkpoint",
        ]
        assert status(ids["waiting"]) is TaskStatus.CANCELLED
        assert store.history(ids["waiting"])[-1].reason == "controller closed"
        active = [s for s in store.query() if not s.is_terminal]
        assert active == []
    finally:
        store.close()


def test_the_controller_serves_until_the_programs_own_threads_end(tmp_path: Path) -> None:
    """Closed at exit, not when the main code ends: a thread of the program that
    submits after the main code ended is still served."""
    _, stdout, _ = _run(tmp_path, "thread")
    assert "later done" in stdout


FORKING = NODE + textwrap.dedent(
    """
    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
    run = node.submit(long)
    assert started.wait(30)
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a normal exit: atexit hooks run in the child
    os.waitpid(child, 0)
    history = [t.reason for t in node.history(run.task_id)]
    print("after the child", run.snapshot().status.value, history, flush=True)
    run.stop(reason="the parent stops it")
    run.wait(30)
    print("desynced", sorted(node.desynced_tasks), flush=True)
    print("final", node.get(run.task_id).status.value, flush=True)
    node.close()
    """
)


def test_a_forked_child_leaves_its_parents_controller_alone(tmp_path: Path) -> None:
    """A child made by ``fork()`` holds copies of the parent's controllers without their
    threads; its exit must not close them (that would write "controller closed" over
    the parent's running tasks and desync them)."""
    lines = _exit_of(tmp_path, FORKING)[0].splitlines()
    assert lines[0].startswith("after the child running"), lines
    assert "controller closed" not in lines[0], lines
    assert lines[1:] == ["desynced []", "final stopped"], lines


SERVING = NODE + textwrap.dedent(
    """
    @node.task(name="tick")
    def tick(token):
        print("fired", flush=True)

    node.schedule("often", "tick", IntervalTrigger(0.1))
    print("long", node.submit(long).task_id, flush=True)
    print("served until", node.serve(), flush=True)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_keeps_a_node_with_schedules_until_a_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """``node.serve()``: the program's main code blocks there, the schedule keeps firing,
    and Ctrl-C or SIGTERM closes the node cleanly (exit 0, its running task stopped)."""
    script = tmp_path / "serving.py"
    script.write_text(SERVING)
    node = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "tasks.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WORKERS": "2"},  # one for the long task, one for the ticks
    )
    try:
        assert node.stdout is not None
        lines = []
        while lines.count("fired") < 3:  # the main code ended in serve(); it still fires
            line = node.stdout.readline()
            assert line, "the node ended before firing three times"
            lines.append(line.strip())
        node.send_signal(sig)
        rest, stderr = node.communicate(timeout=30)
    finally:
        node.kill()
    assert node.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert f"served until {sig.name}" in rest.splitlines()
    long_id = next(line.split()[1] for line in lines if line.startswith("long "))
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        snapshot = store.get(long_id)
        assert snapshot is not None and snapshot.status is TaskStatus.STOPPED
        assert all(s.is_terminal for s in store.query())
    finally:
        store.close()


DEAF = textwrap.dedent(
    """
    import sys, time
    from chongming_task import Controller

    node = Controller(sys.argv[1])

    @node.task(name="deaf")
    def deaf(token):  # a C call or a tight loop: it never reaches a checkpoint
        while True:
            time.sleep(0.01)

    @node.task(name="polite")
    def polite(token):
        while True:
            token.sleep(0.01)

    print("deaf", node.submit(deaf).task_id, flush=True)
    print("polite", node.submit(polite).task_id, flush=True)
    print("served until", node.serve(), flush=True)
    """
)


def test_ctrl_c_on_a_node_with_a_deaf_task_says_what_it_waits_for_and_what_became_of_each(
    tmp_path: Path,
) -> None:
    script = tmp_path / "deaf.py"
    script.write_text(DEAF)
    node = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "tasks.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert node.stdout is not None and node.stderr is not None
        ids = dict(node.stdout.readline().split() for _ in range(2))
        store = SqliteTaskStore(tmp_path / "tasks.db")
        try:
            from tests.conftest import wait_until

            wait_until(
                lambda: all(
                    (s := store.get(t)) is not None and s.status is TaskStatus.RUNNING
                    for t in ids.values()
                ),
                what="both running",
            )
        finally:
            store.close()
        node.send_signal(signal.SIGINT)
        # Said while it waits, before the close ends: the deaf task by name, the wait.
        waiting = node.stderr.readline()
        assert node.poll() is None, "it said nothing before it exited"
        assert "closing: waiting up to" in waiting and "deaf" in waiting, waiting
        assert "polite" not in waiting  # that one stopped at once
        rest, said = node.communicate(timeout=60)
    finally:
        node.kill()
    assert node.returncode == 0, said
    assert "served until SIGINT" in rest
    closed = next(line for line in said.splitlines() if "closed:" in line)
    assert f"deaf {ids['deaf'][:12]} still stopping: it never reached a checkpoint" in closed
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        assert store.get(ids["deaf"]).status is TaskStatus.STOPPING  # the truth: unknown
        assert store.get(ids["polite"]).status is TaskStatus.STOPPED
    finally:
        store.close()


STUBBORN = textwrap.dedent(
    """
    import asyncio, sys, time
    from chongming_task import Controller

    async def stubborn(token):
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass  # refuses every cancellation

    node = Controller(sys.argv[1])
    run = node.task(stubborn, name="stubborn", timeout_grace=0.2).submit()
    while run.status.value != "running":
        time.sleep(0.01)
    node.close()
    print(run.snapshot().failure.kind.value, flush=True)
    """
)


def test_a_coroutine_abandoned_at_close_is_not_called_a_crash_at_the_interpreters_exit(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", STUBBORN, str(tmp_path / "t.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "abandoned"), done.stderr
    assert "refused cancellation" in done.stderr  # the close said what became of it
    assert "carrier crashed" not in done.stderr and "ValueError" not in done.stderr
