"""What a newcomer meets first: a failed task keeps its traceback (bounded,
the raise kept) and `show` prints it; a script's functions are named without
``__main__.``; `ps --name` takes a glob."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    SqliteTaskStore,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.values import MAX_TRACEBACK


def _cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def lookup(token: CancellationToken, key: str) -> str:
    table = {"present": "yes"}
    return table[key]


def chained(token: CancellationToken, size: int) -> None:
    try:
        raise KeyError("k" * size)  # a cause far longer than a stored traceback
    except KeyError as cause:
        raise ValueError("at the bottom") from cause


def test_the_traceback_is_stored_and_shown(tmp_path: Path) -> None:
    db = tmp_path / "tb.db"
    store = SqliteTaskStore(db)
    with Controller(store, owner="node-a") as node:
        job = node.task(lookup, name="lookup")
        run = node.submit(job, "missing")
        final = run.wait(10)
    assert final.status is TaskStatus.FAILED and final.failure is not None
    assert final.failure.message == "KeyError: 'missing'"
    stored = store.get(run.task_id)
    store.close()
    assert stored is not None and stored.failure is not None
    tb = stored.failure.traceback or ""
    assert tb.startswith("Traceback (most recent call last):")
    assert "in lookup" in tb and "return table[key]" in tb
    assert tb.rstrip().endswith("KeyError: 'missing'")

    shown = _cli(db, "show", run.task_id)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback (most recent call last):" in shown.stdout
    assert "return table[key]" in shown.stdout
    as_json = _cli(db, "--json", "show", run.task_id)
    assert json.loads(as_json.stdout)["failure"]["traceback"] == tb


def test_a_huge_traceback_keeps_its_end(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "deep.db")
    with Controller(store, owner="node-a") as node:
        job = node.task(chained, name="chained")
        run = node.submit(job, 3 * MAX_TRACEBACK)
        final = run.wait(10)
    store.close()
    assert final.failure is not None
    tb = final.failure.traceback or ""
    assert len(tb) <= MAX_TRACEBACK + 64
    assert tb.startswith("[... ") and "earlier characters]" in tb.splitlines()[0]
    assert tb.rstrip().endswith("ValueError: at the bottom")


def test_a_scripts_own_function_is_named_without_main() -> None:
    from chongming_task.definitions import define

    def ingest(token: CancellationToken) -> None:
        return None

    ingest.__module__ = "__main__"
    ingest.__qualname__ = "ingest"
    assert define(ingest).name == "ingest"
    assert define(lookup).name == "tests.unit.test_first_hour.lookup"


def test_ps_name_takes_a_glob(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from chongming_task import TaskSnapshot

    db = tmp_path / "glob.db"
    store = SqliteTaskStore(db)
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    for i, name in enumerate(["etl.extract", "etl.load", "report", "etl"]):
        store.create(
            TaskSnapshot(
                task_id=f"t{i}",
                name=name,
                status=TaskStatus.QUEUED,
                status_version=1,
                created_at=t0,
            )
        )
    store.close()

    def names(*flags: str) -> list[str]:
        out = _cli(db, "--json", "ps", *flags)
        assert out.returncode == 0, out.stderr
        return sorted(t["name"] for t in json.loads(out.stdout))

    assert names("--name", "etl.*") == ["etl.extract", "etl.load"]
    assert names("--name", "*t") == ["etl.extract", "report"]
    assert names("--name", "etl") == ["etl"]  # no wildcard: the exact name
    assert len(names("--name", "etl*", "--limit", "2")) == 2


def test_prune_dry_run_counts_and_deletes_nothing(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from chongming_task import TaskSnapshot

    db = tmp_path / "prune.db"
    store = SqliteTaskStore(db)
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    for i in range(5):
        store.create(
            TaskSnapshot(
                task_id=f"t{i}",
                name="job",
                status=TaskStatus.SUCCEEDED,
                status_version=4,
                created_at=t0,
            )
        )
    store.create(
        TaskSnapshot(
            task_id="live",
            name="job",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=t0,
        )
    )
    store.close()
    dry = _cli(db, "--json", "prune", "--keep", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"dry_run": True, "pruned": 3}
    assert "would prune 3" in _cli(db, "prune", "--keep", "2", "--dry-run").stdout
    assert len(json.loads(_cli(db, "--json", "ps", "--all").stdout)) == 6  # all kept
    real = _cli(db, "--json", "prune", "--keep", "2")
    assert json.loads(real.stdout)["pruned"] == 3
    assert len(json.loads(_cli(db, "--json", "ps", "--all").stdout)) == 3


def test_leaving_watch_with_ctrl_c_is_not_an_error(tmp_path: Path) -> None:
    import signal
    import time
    from datetime import UTC, datetime

    from chongming_task import Progress, TaskSnapshot

    db = tmp_path / "watch.db"
    store = SqliteTaskStore(db)
    store.create(  # a running task: watch prints its progress on every refresh
        TaskSnapshot(
            task_id="t1",
            name="job",
            status=TaskStatus.RUNNING,
            status_version=3,
            created_at=datetime(2026, 3, 1, tzinfo=UTC),
            progress=Progress(current=1, total=2),
        )
    )
    store.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("watching ")
    assert "t1" in proc.stdout.readline()  # watching: its loop is running
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "error" not in err and "Traceback" not in err


def test_negative_waits_are_usage_errors(tmp_path: Path) -> None:
    db = tmp_path / "neg.db"
    SqliteTaskStore(db).close()
    for args, said in (
        (["watch", "--interval", "-1"], "argument --interval: '-1' is not a number of seconds"),
        (["watch", "--interval", "0"], "--interval must be > 0"),
        (["watch", "--interval", "nan"], "argument --interval: 'nan' is not a number of seconds"),
        (["stop", "some-task", "--wait", "-5"], "argument --wait: '-5' is not a number of"),
    ):
        result = _cli(db, *args)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_cancelling_a_paused_task_says_it_was_paused() -> None:
    from chongming_task import InMemoryTaskStore
    from tests.conftest import wait_until

    with Controller(InMemoryTaskStore(), owner="node-a") as node:

        @node.task(name="loop")
        def loop(token: CancellationToken) -> None:
            while True:
                token.checkpoint()
                token.sleep(0.01)

        paused, running = node.submit(loop), node.submit(loop)
        wait_until(lambda: paused.status is TaskStatus.RUNNING, what="running")
        wait_until(lambda: running.status is TaskStatus.RUNNING, what="running")
        node.pause(paused.task_id)
        wait_until(lambda: paused.status is TaskStatus.PAUSED, what="paused")
        node.cancel(paused.task_id)
        node.cancel(running.task_id)
        assert paused.wait(5).status is TaskStatus.CANCELLED
        assert running.wait(5).status is TaskStatus.CANCELLED
    assert paused.history()[-1].reason == "cancelled while paused"
    assert running.history()[-1].reason == "cancelled while running"


def test_ps_shows_age_duration_and_the_progress_message(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from chongming_task import Progress, TaskSnapshot

    db = tmp_path / "cols.db"
    store = SqliteTaskStore(db)
    now = datetime.now(UTC)
    store.create(
        TaskSnapshot(
            task_id="done",
            name="job",
            status=TaskStatus.SUCCEEDED,
            status_version=4,
            created_at=now - timedelta(hours=2),
            started_at=now - timedelta(hours=2),
            ended_at=now - timedelta(hours=2) + timedelta(seconds=75),
        )
    )
    store.create(
        TaskSnapshot(
            task_id="busy",
            name="job",
            status=TaskStatus.RUNNING,
            status_version=3,
            created_at=now - timedelta(minutes=3),
            started_at=now - timedelta(minutes=3),
            progress=Progress(current=5, total=10, message="page 5"),
            lease_owner="n",
            lease_until=now + timedelta(hours=1),
        )
    )
    store.close()
    table = _cli(db, "ps", "--all").stdout.splitlines()
    assert table[0].split()[7:9] == ["AGE", "TOOK"]  # after "TASK ID ... OWNER"
    done = next(line for line in table if line.startswith("done"))
    busy = next(line for line in table if line.startswith("busy"))
    assert " 2h00m " in done and " 1m15s " in done  # 2 h old, ran 75 s
    assert " 3m0" in busy and "page 5" in busy and " ok" in busy


def greet(token: CancellationToken, who: str) -> str:
    return f"hello {who}"


def extract_step(token: CancellationToken) -> int:
    return 1


def load_step(token: CancellationToken) -> int:
    return 2


def test_plain_functions_are_tasks_defined_on_first_use() -> None:
    import pytest

    from chongming_task import ConfigurationError, InMemoryTaskStore
    from chongming_task.pipelines import Pipeline

    with Controller(InMemoryTaskStore(), owner="node-a") as node:
        first, second = node.submit(greet, "bob"), node.submit(greet, "amy")
        assert first.result(5) == "hello bob" and second.result(5) == "hello amy"
        assert (
            first.snapshot().name == second.snapshot().name == ("tests.unit.test_first_hour.greet")
        )
        pipeline = Pipeline("etl")
        pipeline.add("extract", extract_step)
        pipeline.add("load", load_step, depends_on=["extract"])
        finals = node.submit_pipeline(pipeline).wait(10)
        assert {key: s.status for key, s in finals.items()} == {
            "extract": TaskStatus.SUCCEEDED,
            "load": TaskStatus.SUCCEEDED,
        }
        with pytest.raises(ConfigurationError, match="not a task: 42"):
            node.submit(42)  # type: ignore[arg-type]


def test_ids_differ_early_and_a_unique_prefix_names_a_task(tmp_path: Path) -> None:
    db = tmp_path / "ids.db"
    with Controller(SqliteTaskStore(db), owner="node-a") as node:
        runs = [node.submit(greet, str(n)) for n in range(40)]
        for run in runs:
            run.wait(10)
    ids = [run.task_id for run in runs]
    # Random from the first digit: 40 ids made in the same millisecond-range differ
    # within their first six characters (a clash has odds of about 1 in 20,000).
    assert len({task_id[:6] for task_id in ids}) == len(ids)
    target = ids[0]
    for command in (("show",), ("history",), ("--json", "show")):
        *flags, verb = command
        done = _cli(db, *flags, verb, target[:6])
        assert done.returncode == 0, done.stderr
        assert target in done.stdout or verb == "history"
    shown = json.loads(_cli(db, "--json", "show", target[:8]).stdout)
    assert shown["task_id"] == target
    assert target[:12] in _cli(db, "ps", "--all").stdout  # the table shows a 12-char id
    stop = _cli(db, "stop", target[:7])
    assert stop.returncode == 0 and "already succeeded" in stop.stdout, stop.stdout

    too_short = _cli(db, "show", target[:5])
    assert too_short.returncode == 1
    assert "needs 6+ characters" in too_short.stderr
    missing = _cli(db, "show", "zzzzzzzz")
    assert missing.returncode == 1 and "no task zzzzzzzz" in missing.stderr


def test_an_ambiguous_prefix_is_an_error_naming_the_candidates(tmp_path: Path) -> None:
    db = tmp_path / "clash.db"
    store = SqliteTaskStore(db)
    with Controller(store, owner="node-a") as node:
        node.task(greet, name="greet")
    base = datetime.now(UTC)
    for n, task_id in enumerate(["abcdef01", "abcdef02", "abcdff03"]):
        store.create(
            TaskSnapshot(
                task_id=task_id,
                name=f"job{n}",
                status=TaskStatus.QUEUED,
                status_version=1,
                created_at=base,
            )
        )
    store.close()
    clash = _cli(db, "show", "abcdef")
    assert clash.returncode == 1
    assert clash.stderr.count("\n") == 1, clash.stderr  # one line
    assert "ambiguous" in clash.stderr
    assert "abcdef01 (job0)" in clash.stderr and "abcdef02 (job1)" in clash.stderr
    assert "abcdff03" not in clash.stderr
    unique = _cli(db, "--json", "show", "abcdff")
    assert json.loads(unique.stdout)["task_id"] == "abcdff03"


def _held_elsewhere(db: Path, status: TaskStatus) -> str:
    """A task in the store held by a node that is not this test (it never polls)."""
    store = SqliteTaskStore(db)
    now = datetime.now(UTC)
    task_id = f"{status.value}0001"
    store.create(
        TaskSnapshot(
            task_id=task_id,
            name="elsewhere",
            status=status,
            status_version=1,
            created_at=now,
            started_at=now,
            owner="node-far",
        )
    )
    store.close()
    return task_id


def _commands(db: Path) -> int:
    with closing(sqlite3.connect(db)) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM commands").fetchone()
    return int(count)


def test_controls_answer_exactly_what_happened(tmp_path: Path) -> None:
    db = tmp_path / "exact.db"
    paused = _held_elsewhere(db, TaskStatus.PAUSED)
    running = _held_elsewhere(db, TaskStatus.RUNNING)
    done = _held_elsewhere(db, TaskStatus.FAILED)
    cases = [
        (("pause", paused), "already paused"),
        (("resume", running), "not paused (it is running); nothing to do"),
        (("stop", done), "already failed; nothing to do"),
        (("cancel", done), "already failed; nothing to do"),
    ]
    for args, said in cases:
        result = _cli(db, *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{args[0]} {args[1]}: {said}"
    assert _commands(db) == 0  # the stored status answered: no command was written
    as_json = json.loads(_cli(db, "--json", "pause", paused).stdout)
    assert as_json["outcome"] == "already-paused" and as_json["status"] == "paused"

    accepted = _cli(db, "pause", running)
    assert accepted.returncode == 0
    first, hint = accepted.stdout.strip().splitlines()
    assert first.startswith(f"pause {running}: request accepted (command ")
    assert "now" not in accepted.stdout  # no claim about an effect it did not see
    assert hint.startswith("check with: ") and str(db.resolve()) in hint
    assert _commands(db) == 1


def test_a_wait_that_runs_out_says_the_request_stays_queued(tmp_path: Path) -> None:
    db = tmp_path / "wait.db"
    running = _held_elsewhere(db, TaskStatus.RUNNING)
    result = _cli(db, "pause", running, "--wait", "0.3")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "request accepted (command " in result.stderr
    assert "stays queued" in result.stderr and "still running after 0.3s" in result.stderr


def _control_pressing_ctrl_c(
    db: Path, task_id: str, presses: int, monkeypatch: pytest.MonkeyPatch
) -> int:
    """``stop --wait`` in this process, Ctrl-C pressed ``presses`` times just as the
    request's write has ended (before the command returns)."""
    from chongming_task.cli import main
    from chongming_task.control import StoreControl

    send = StoreControl.send

    def send_then_ctrl_c(self: StoreControl, *args: Any, **kwargs: Any) -> Any:
        receipt = send(self, *args, **kwargs)
        for _ in range(presses):
            signal.raise_signal(signal.SIGINT)
        return receipt

    monkeypatch.setattr(StoreControl, "send", send_then_ctrl_c)
    return main(["--db", str(db), "stop", task_id, "--wait", "60"])  # conftest restores SIGPIPE


def test_ctrl_c_while_the_request_is_written_is_heard_once_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "held.db"
    running = _held_elsewhere(db, TaskStatus.RUNNING)
    assert _control_pressing_ctrl_c(db, running, 1, monkeypatch) == 130
    err = capsys.readouterr().err
    assert "interrupted: stop" in err and "request accepted (command " in err
    assert "stays queued" in err
    assert _commands(db) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_second_ctrl_c_while_the_request_is_written_interrupts_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "held.db"
    running = _held_elsewhere(db, TaskStatus.RUNNING)
    assert _control_pressing_ctrl_c(db, running, 2, monkeypatch) == 130
    assert capsys.readouterr().err == "chongming-task: error: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_a_wait_says_the_request_stays_queued(tmp_path: Path) -> None:
    from tests.conftest import wait_until

    db = tmp_path / "sigint.db"
    running = _held_elsewhere(db, TaskStatus.RUNNING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "stop", running, "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _commands(db) == 1, what="the command written")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted" in err and "request accepted (command " in err
    assert "stays queued" in err and "Traceback" not in err
