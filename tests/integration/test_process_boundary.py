"""The truth at the process boundary, with real worker processes: an answer is only ever
taken for the job it was sent for, a worker whose stream cannot be read is ended before
anything else is sent to it, a forced end reaches what the task started and says what it
did, and nothing a node started outlives it, suspended or not."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chongming_task import ConfigurationError, Controller, FailureKind, SqliteTaskStore, TaskStatus
from chongming_task.node import forkserver
from chongming_task.node.forkserver import ForkServer, Worker, descendants
from tests.conftest import wait_until
from tests.integration import process_tasks as tasks

S = TaskStatus
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Controller]:
    """One worker process: the task after a broken one would get the same worker."""
    with tasks.node_on(tmp_path / "tasks.db", 1) as made:
        yield made


def _script(script: Path, db: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, str(script), str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=script.parent,
    )


@pytest.mark.parametrize(
    ("breaks", "sent"),
    [
        (tasks.scribbles, "sent bytes that are not a frame (b'thes'...)"),
        (tasks.forges, "sent a frame of job 10000 while it carried job 1"),
    ],
    ids=["not-a-frame", "another-jobs-frame"],
)
def test_a_stream_that_cannot_be_trusted_ends_its_worker_and_no_answer_goes_astray(
    node: Controller, tmp_path: Path, breaks: Callable[..., str], sent: str
) -> None:
    broken = node.task(breaks, carrier="process", name="breaks", retries=0)
    pid = node.task(tasks.pid, carrier="process", name="pid")
    tell = tmp_path / "breaker"
    final = broken.submit(str(tell)).wait(timeout=60)
    assert final.status is S.FAILED and final.failure is not None and final.outcome is None
    assert final.failure.kind is FailureKind.CRASHED and not final.failure.carrier_may_run
    breaker = int(tell.read_text())
    assert final.failure.message == (
        f"CarrierCrashed: its worker process {breaker} {sent}: it was ended before "
        "anything else was sent to it"
    )
    assert not tasks.alive(breaker)  # ended before the attempt was recorded
    after = pid.submit()  # its own function, in a fresh worker, with its own answer
    assert after.result(timeout=60) != breaker


def test_a_log_record_whose_extra_cannot_be_read_costs_that_field_not_the_stream(
    node: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    logs = node.task(tasks.logs_unloadable_extra, carrier="process", name="logs", retries=0)
    pid = node.task(tasks.pid, carrier="process", name="pid")
    with caplog.at_level(logging.WARNING, logger="tests.extra"):
        final = logs.submit().wait(timeout=60)
        worker = pid.submit().result(timeout=60)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.EXCEPTION
    assert final.failure.message == "ValueError: raised by the task that logged"  # its own
    (record,) = [r for r in caplog.records if r.name == "tests.extra"]
    assert record.getMessage().startswith("a record with a bad extra [its extra fields cannot")
    assert getattr(record, "task_name", None) == "logs"
    assert pid.submit().result(timeout=60) == worker  # the stream stayed whole: same worker


def test_arguments_that_cannot_be_rebuilt_in_the_worker_fail_the_attempt_with_why(
    node: Controller,
) -> None:
    takes = node.task(tasks.takes, carrier="process", name="takes", retries=0)
    pid = node.task(tasks.pid, carrier="process", name="pid")
    worker = pid.submit().result(timeout=60)
    final = takes.submit(tasks.BreaksInTheWorker()).wait(timeout=60)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.EXCEPTION
    assert final.failure.message.startswith("RuntimeError: made in process")
    assert "cannot be rebuilt in another" in final.failure.message
    assert "while its worker process read the job" in (final.failure.traceback or "")
    assert pid.submit().result(timeout=60) == worker  # the worker serves on


@pytest.mark.parametrize("session", [False, True], ids=["in-its-group", "own-session"])
def test_a_timeout_ends_the_processes_the_task_started_and_says_what_happened(
    node: Controller, tmp_path: Path, session: bool
) -> None:
    starts = node.task(
        tasks.starts_a_child,
        carrier="process",
        name="starts",
        timeout=2.0,  # room for it to start its child first on a loaded machine
        timeout_grace=0.2,
        retries=0,
    )
    tell = tmp_path / "pids"
    final = starts.submit(str(tell), session).wait(timeout=60)
    worker, sleeper = (int(part) for part in tell.read_text().split())
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.TIMEOUT and not final.failure.carrier_may_run
    assert final.failure.message == (
        f"timed out after 2.0s (its worker process {worker} was terminated with the 1 "
        "process its task had started)"
    )
    assert "checkpoint" not in final.failure.message
    wait_until(lambda: not tasks.alive(sleeper), timeout=10, what="the task's own child gone")
    assert not tasks.alive(worker)


def test_a_stop_that_ends_the_worker_says_so_in_the_trail(node: Controller, tmp_path: Path) -> None:
    spin = node.task(tasks.spin, carrier="process", name="spin", timeout_grace=0.2)
    tell = tmp_path / "pid"
    run = spin.submit(60, str(tell))
    wait_until(tell.exists, timeout=30, what="the worker started")
    run.stop()
    assert run.wait(timeout=30).status is S.STOPPED
    reasons = [t.reason for t in run.history()]
    assert reasons[-1] == f"its worker process {tell.read_text()} was terminated"
    assert not any("checkpoint" in (reason or "") for reason in reasons)


def test_a_stop_obeyed_at_a_checkpoint_still_says_so(node: Controller) -> None:
    checkpoints = node.task(tasks.checkpoints, carrier="process", name="checkpoints")
    run = checkpoints.submit()
    wait_until(lambda: run.status is S.RUNNING, timeout=30, what="running")
    run.stop()
    assert run.wait(timeout=30).status is S.STOPPED
    assert run.history()[-1].reason == "stopped at a checkpoint"


def test_the_workers_niceness_is_a_setting(tmp_path: Path) -> None:
    here = os.getpriority(os.PRIO_PROCESS, 0)
    for setting, expected in ((None, min(19, here + 10)), (3, min(19, here + 3)), (0, here)):
        kwargs = {} if setting is None else {"process_niceness": setting}
        with Controller(
            SqliteTaskStore(tmp_path / f"n{setting}.db"), max_processes=1, **kwargs
        ) as node:
            nice = node.task(tasks.niceness, carrier="process", name="nice")
            assert nice.submit().result(timeout=60) == expected
    for wrong in (-1, 20, 2.5, True):
        with pytest.raises(ConfigurationError, match="process_niceness must be an int from 0"):
            Controller(SqliteTaskStore(tmp_path / "x.db"), process_niceness=wrong)  # type: ignore[arg-type]


KILLED_NODE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from chongming_task import Controller, SqliteTaskStore, TaskStatus
    from tests.integration import process_tasks as tasks

    if __name__ == "__main__":
        folder = Path(sys.argv[1])
        node = Controller(SqliteTaskStore(folder / "n.db"), max_processes=3,
                          activity_interval=0.05)
        spin = node.task(tasks.spin, carrier="process", name="spin", suspend=True,
                         timeout_grace=0.2)
        starts = node.task(tasks.starts_a_child, carrier="process", name="starts")
        pid = node.task(tasks.pid, carrier="process", name="pid")
        suspended = spin.submit(600, str(folder / "suspended"))
        starts.submit(str(folder / "starter"))
        pid.submit().result(60)  # perhaps a third worker, idle once it answered
        while not (folder / "suspended").exists():
            time.sleep(0.01)
        suspended.pause()
        while suspended.status is not TaskStatus.PAUSED:
            time.sleep(0.01)
        while not (folder / "starter").exists():
            time.sleep(0.01)
        (folder / "ready").write_text("1")
        node.serve()
    """
)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_process_tree_is_found_whole_from_the_childrens_lists_and_from_a_scan() -> None:
    # sh, below it a sleep and a subshell, below that another sleep
    tree = subprocess.Popen(["sh", "-c", "sleep 60 & (sleep 60 & wait) & wait"])
    try:
        wait_until(lambda: len(descendants(tree.pid)) == 3, timeout=30, what="the tree")
        found = descendants(tree.pid)
        assert sorted(found) == sorted(forkserver._below_by_scan(tree.pid))
        names = sorted(Path(f"/proc/{pid}/comm").read_text().strip() for pid in found)
        assert names == ["sh", "sleep", "sleep"]
    finally:
        for pid in [*descendants(tree.pid), tree.pid]:
            os.kill(pid, signal.SIGKILL)
        tree.wait(10)
    assert descendants(tree.pid) == []


def test_a_node_killed_with_kill_9_leaves_no_process_behind(tmp_path: Path) -> None:
    script = tmp_path / "node.py"
    script.write_text(KILLED_NODE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=env)
    try:
        wait_until((tmp_path / "ready").exists, timeout=120, what="the node ready")
        started = descendants(proc.pid)
        suspended = int((tmp_path / "suspended").read_text())
        worker, sleeper = (int(part) for part in (tmp_path / "starter").read_text().split())
        assert {suspended, worker, sleeper} <= set(started)
        assert tasks.stat(suspended)[0] == "T"  # stopped where it stood
        server = int(tasks.stat(worker)[1])
        assert {server, suspended, worker, sleeper} <= set(started)
        # The node started one process of its own, the fork server: every other is below it.
        assert [pid for pid in started if int(tasks.stat(pid)[1]) == proc.pid] == [server]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    for pid in started:
        wait_until(lambda pid=pid: not tasks.alive(pid), timeout=10, what=f"process {pid} gone")


UNGUARDED = textwrap.dedent(
    """
    import sys
    from chongming_task import Controller, SqliteTaskStore
    from tests.integration import process_tasks as tasks

    print("the script's top level ran", flush=True)
    with Controller(SqliteTaskStore(sys.argv[1]), max_processes=1) as node:
        print(node.task(tasks.square, carrier="process", name="sq").submit(7).result(60)["square"])
    """
)

UNGUARDED_OWN = textwrap.dedent(
    """
    import sys
    from chongming_task import Controller, SqliteTaskStore

    def double(token, x):
        return 2 * x

    with Controller(SqliteTaskStore(sys.argv[1]), max_processes=1) as node:
        print(node.task(double, carrier="process").submit(21).result(60))
    """
)


def test_a_script_without_a_main_guard_runs_once_when_its_process_tasks_live_elsewhere(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(UNGUARDED)
    done = _script(script, tmp_path / "a.db")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["the script's top level ran", "49"]

    own = tmp_path / "own.py"
    own.write_text(UNGUARDED_OWN)
    refused = _script(own, tmp_path / "b.db")
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("chongming_task.errors.InvalidValue: task double: carrier='process'")
    assert f"defined in the script {own}" in last
    assert 'under `if __name__ == "__main__":`' in last


def test_a_retry_asked_for_in_a_worker_process_crosses_back(node: Controller) -> None:
    asks = node.task(tasks.asks_again, carrier="process", name="asks", retries=0)
    run = asks.submit()
    assert run.result(timeout=60) == 2
    assert "asked to run again in 0.01s: not yet" in [t.reason for t in run.history()]


def test_a_pause_asked_while_the_worker_is_being_started_suspends_it_once_started(
    node: Controller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked = ForkServer.fork

    def slowly(server: ForkServer) -> Worker:
        time.sleep(1.0)  # a loaded machine: the pause's grace runs out before any worker
        return forked(server)

    monkeypatch.setattr(ForkServer, "fork", slowly)
    spin = node.task(tasks.spin, carrier="process", name="spin", suspend=True, timeout_grace=0.05)
    tell = tmp_path / "pid"
    run = spin.submit(600, str(tell))
    wait_until(lambda: run.status is S.RUNNING, timeout=60, what="running")
    assert not tell.exists()  # no worker carries it yet
    run.pause()
    wait_until(lambda: run.status is S.PAUSED, timeout=60, what="suspended once started")
    said = run.history()[-1].reason or ""
    assert said.startswith("suspended: its worker process ")
    worker = int(said.split()[4])
    assert tasks.stat(worker)[0] == "T"  # stopped where it stood
    run.resume()
    wait_until(tell.exists, timeout=60, what="the task going on once resumed")
    assert int(tell.read_text()) == worker
    run.stop()
    assert run.wait(60).status is S.STOPPED


def test_a_suspended_worker_that_dies_fails_its_task_crashed_saying_so(
    node: Controller, tmp_path: Path
) -> None:
    spin = node.task(
        tasks.spin, carrier="process", name="spin", suspend=True, timeout_grace=0.2, retries=2
    )
    tell = tmp_path / "pid"
    run = spin.submit(600, str(tell))
    wait_until(tell.exists, timeout=60, what="the worker started")
    run.pause()
    wait_until(lambda: run.status is S.PAUSED, timeout=30, what="suspended")
    worker = int(tell.read_text())
    os.kill(worker, signal.SIGKILL)  # as the kernel's OOM killer would
    final = run.wait(timeout=30)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.CRASHED
    assert final.failure.message == (
        f"CarrierCrashed: its worker process {worker} died: killed by SIGKILL"
    )
    trail = [(t.to_status, t.reason) for t in run.history()][-2:]
    assert trail[0] == (S.STOPPING, "its carrier ended while it was paused")
    assert trail[1][0] is S.FAILED and final.attempt == 1  # no retry from a pause
