"""The CLI, driven as real subprocesses against a SQLite file that real nodes are using."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus
from chongming_task.policies import BucketPolicy
from tests.conftest import Lines, wait_until
from tests.integration.test_cross_process import Node

POLICY = BucketPolicy(64)


def key_in(low: int, high: int, salt: str = "") -> str:
    return next(
        k for k in (f"{salt}key{i}" for i in range(10_000)) if low <= POLICY.bucket_for(k) <= high
    )


def cli(db: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}: {result.stderr}")
    return result


def cli_json(db: Path, *args: str) -> object:
    return json.loads(cli(db, "--json", *args).stdout)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, Node, Node]]:
    """Two nodes on one file: A owns buckets 0-31, B owns 32-63, one loop task each."""
    db = tmp_path / "shared.db"
    a = Node(db, "--owner", "node-a", "--owned", "0-31", "--submit", f"loop@{key_in(0, 31)}")
    b = Node(db, "--owner", "node-b", "--owned", "32-63", "--submit", f"loop@{key_in(32, 63)}")
    yield db, a, b
    a.finish()
    b.finish()


def _running(db: Path, task_id: str) -> bool:
    store = SqliteTaskStore(db)
    try:
        snap = store.get(task_id)
        return snap is not None and snap.status is TaskStatus.RUNNING
    finally:
        store.close()


def test_ps_mine_shows_only_owned_buckets_and_buckets_marks_them(
    cluster: tuple[Path, Node, Node],
) -> None:
    db, a, b = cluster
    (mine,), (theirs,) = a.task_ids, b.task_ids
    wait_until(lambda: _running(db, mine) and _running(db, theirs))
    everything = cli(db, "ps").stdout
    assert mine[:12] in everything and theirs[:12] in everything
    only_mine = cli(db, "--owned-buckets", "0-31", "ps", "--mine").stdout
    assert mine[:12] in only_mine and theirs[:12] not in only_mine
    rows = cli_json(db, "--owned-buckets", "0-31", "ps", "--mine")
    assert [r["task_id"] for r in rows] == [mine]  # type: ignore[union-attr,index]
    bucket_a = a.lines[0]["bucket"]
    bucket_b = b.lines[0]["bucket"]
    table = cli(db, "--owned-buckets", "0-31", "buckets").stdout
    assert f"\n{bucket_a}*" in table and f"\n{bucket_b} " in table
    assert f"{bucket_b}*" not in table
    data = cli_json(db, "--owned-buckets", "0-31", "buckets")
    by_bucket = {x["bucket"]: x for x in data["buckets"]}  # type: ignore[index]
    running = {"running": 1}
    assert by_bucket[bucket_a] == {
        "bucket": bucket_a,
        "tasks": 1,
        "unfinished": running,
        "finished": 0,
        "owned": True,
    }
    assert by_bucket[bucket_b] == {
        "bucket": bucket_b,
        "tasks": 1,
        "unfinished": running,
        "finished": 0,
        "owned": False,
    }
    header, *lines = table.splitlines()
    assert header.split() == ["BUCKET", "TASKS", "RUNNING", "FINISHED"]
    assert any(line.split()[:4] == [f"{bucket_a}*", "1", "1", "0"] for line in lines), table


def test_stop_from_the_cli_stops_a_task_running_in_a_node(
    cluster: tuple[Path, Node, Node],
) -> None:
    db, a, _ = cluster
    (task_id,) = a.task_ids
    wait_until(lambda: _running(db, task_id))
    out = cli(db, "stop", task_id, "--wait", "20").stdout
    assert "request accepted" in out and out.rstrip().endswith("now stopped")
    shown = cli_json(db, "show", task_id)
    assert shown["status"] == "stopped"  # type: ignore[index]
    trail = cli_json(db, "history", task_id)
    stops = [t for t in trail if t["to"] == "stopping"]  # type: ignore[union-attr]
    assert len(stops) == 1 and stops[0]["actor"].startswith("cli:")
    again = cli(db, "stop", task_id).stdout
    assert "already stopped" in again


def test_pause_and_resume_from_the_cli(cluster: tuple[Path, Node, Node]) -> None:
    db, _, b = cluster
    (task_id,) = b.task_ids
    wait_until(lambda: _running(db, task_id))
    assert cli(db, "pause", task_id, "--wait", "20").stdout.rstrip().endswith("now paused")
    assert cli(db, "resume", task_id, "--wait", "20").stdout.rstrip().endswith("now running")


def test_reconcile_dry_run_changes_nothing(cluster: tuple[Path, Node, Node]) -> None:
    db, a, b = cluster
    # The nodes' own tasks must be settled (running), or their start-up transitions would
    # change the store between the two dumps below.
    wait_until(lambda: _running(db, a.task_ids[0]) and _running(db, b.task_ids[0]))
    store = SqliteTaskStore(db)
    past = datetime.now(UTC) - timedelta(minutes=10)
    dead_key = key_in(0, 31, salt="dead")
    store.create(
        TaskSnapshot(
            task_id="dead-1",
            name="orphan",
            status=TaskStatus.RUNNING,
            status_version=3,
            created_at=past,
            bucket=POLICY.bucket_for(dead_key),
            bucket_key=dead_key,
            lease_owner="gone",
            lease_until=past,
        )
    )
    store.close()

    def dump() -> list[tuple[object, ...]]:
        conn = sqlite3.connect(db)
        try:
            rows = conn.execute(
                "SELECT task_id, status, status_version FROM tasks ORDER BY task_id"
            ).fetchall()
            trail = conn.execute("SELECT COUNT(*) FROM transitions").fetchone()
            return [*rows, trail]
        finally:
            conn.close()

    before = dump()
    out = cli(db, "--owned-buckets", "0-31", "reconcile", "--dry-run").stdout
    assert "would mark 1 task(s) lost" in out and "dead-1" in out
    data = cli_json(db, "--owned-buckets", "0-31", "reconcile", "--dry-run")
    assert data == {"dry_run": True, "scope": "0-31", "lost": ["dead-1"], "let_go": []}
    assert dump() == before
    # Node B's buckets do not include the orphan: its reconcile leaves it alone.
    assert cli_json(db, "--owned-buckets", "32-63", "reconcile") == {
        "dry_run": False,
        "scope": "32-63",
        "lost": [],
        "let_go": [],
    }
    real = cli_json(db, "--owned-buckets", "0-31", "reconcile")
    assert real["lost"] == ["dead-1"]  # type: ignore[index]
    assert cli_json(db, "show", "dead-1")["status"] == "lost"  # type: ignore[index]
    assert _running(db, a.task_ids[0])  # the live task in the same buckets is untouched


def test_json_carries_the_same_data_as_the_table(cluster: tuple[Path, Node, Node]) -> None:
    db, a, b = cluster
    wait_until(lambda: _running(db, a.task_ids[0]) and _running(db, b.task_ids[0]))
    table = cli(db, "ps").stdout.splitlines()[1:]
    rows = cli_json(db, "ps")
    assert [line.split()[:3] for line in table] == [
        [r["task_id"][:12], r["name"], r["status"]]
        for r in rows  # type: ignore[union-attr,index]
    ]
    stats_table = dict(line.split() for line in cli(db, "stats").stdout.splitlines()[1:])
    stats_json = cli_json(db, "stats")
    assert {k: int(v) for k, v in stats_table.items() if k != "total"} == stats_json
    shown = cli_json(db, "show", a.task_ids[0])
    text = cli(db, "show", a.task_ids[0]).stdout
    assert shown["task_id"] in text and shown["status"] in text  # type: ignore[index]


def test_watch_follows_transitions_incrementally(cluster: tuple[Path, Node, Node]) -> None:
    db, a, _ = cluster
    (task_id,) = a.task_ids
    wait_until(lambda: _running(db, task_id))
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chongming_task",
            "--db",
            str(db),
            "watch",  # no --all: the ending shows though the task leaves the filter
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        shown = Lines(watch.stdout)
        # watch starts "from now": wait for its first refresh (a progress line for the
        # running task) before changing anything, or the first events predate it.
        shown.wait_for(lambda text: task_id[:12] in text, timeout=60, what="watch's first refresh")
        first = next(line for line in shown.text().splitlines() if task_id[:12] in line)
        assert "running" in first, first
        cli(db, "pause", task_id, "--wait", "20")
        cli(db, "stop", task_id, "--wait", "20")
        # Until the ending is printed, however long the machine takes; then Ctrl-C, the
        # normal end of a watch.
        shown.wait_for(lambda text: "-> stopped" in text, timeout=60, what="the ending watched")
        watch.send_signal(signal.SIGINT)
        watch.wait(60)
        out, err = shown.close(), watch.stderr.read()  # type: ignore[union-attr]
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    events = [line for line in out.splitlines() if task_id[:12] in line and "->" in line]
    moves = [line.split("  ")[3].split(" by ")[0] for line in events]
    assert all(line.split("  ")[1] == task_id[:12] for line in events)
    assert all(" by cli:" in line for line in events if "requested" in line)
    assert moves == [
        "running -> pausing (pause requested)",
        "pausing -> paused (acknowledged at a checkpoint)",
        "paused -> stopping (stop requested)",
        "stopping -> stopped (stopped at a checkpoint)",
    ], events
    assert any("[" in line or "running" in line for line in out.splitlines())


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("show", "no-such-task"), 1, "no task no-such-task"),
        (("history", "no-such-task"), 1, "no task no-such-task"),
        (("stop", "no-such-task"), 1, "no task no-such-task"),
        (("--owned-buckets", "0-64", "ps"), 2, "bucket(s) 64 out of range"),
        (("--owned-buckets", "5-2", "ps"), 2, "bad bucket range '5-2'"),
        (("--owned-buckets", "x", "stats"), 2, "bad bucket range 'x'"),
        (("--num-buckets", "16", "--owned-buckets", "0-31", "buckets"), 2, "16-31 out of range"),
        (("ps", "--bucket", "99"), 2, "bucket(s) 99 out of range"),
        (("ps", "--mine"), 2, "--mine needs --owned-buckets"),
        (("prune", "--keep", "-1"), 2, "argument --keep: -1 is not a whole number from 0"),
        (("frobnicate",), 2, "invalid choice"),
    ],
)
def test_user_errors_are_one_line_with_an_exit_code(
    tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    db = tmp_path / "t.db"
    SqliteTaskStore(db).close()
    result = cli(db, *args, check=False)
    assert result.returncode == code, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith("chongming-task: error: ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_bucket_flags_are_checked_before_the_database_is_touched(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    result = cli(missing, "--owned-buckets", "0-99", "ps", check=False)
    assert result.returncode == 2 and "out of range" in result.stderr
    assert not missing.exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no database at"),
        ("corrupt", "not a usable SQLite database"),
        ("dsn", "PostgreSQL at 127.0.0.1:1/db: nothing listens there (connection refused)"),
        ("bad-dsn", "malformed PostgreSQL DSN"),
        ("directory", "cannot open SQLite database"),
        ("empty", "is not a chongming-task database"),
    ],
)
def test_store_errors_are_one_line_and_lose_no_data(
    tmp_path: Path, setup: str, message: str
) -> None:
    db = tmp_path / "t.db"
    if setup == "corrupt":
        db.write_bytes(b"definitely not sqlite" * 64)
    elif setup == "directory":
        db.mkdir()
    elif setup == "empty":
        db.write_bytes(b"")
    target = {
        "dsn": "postgresql://user:secret@127.0.0.1:1/db",
        "bad-dsn": "postgresql://user:secret@127.0.0.1/db?nonsense=1",
    }.get(setup, str(db))
    result = subprocess.run(  # in the environment: a password is refused as an argument
        [sys.executable, "-m", "chongming_task", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CHONGMING_DB": target},
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "secret" not in result.stderr
    if setup == "corrupt":
        assert db.read_bytes() == b"definitely not sqlite" * 64
    if setup == "missing":
        assert not db.exists()
    if setup == "empty":
        assert db.read_bytes() == b""  # a read command never gives a file a schema


@pytest.mark.parametrize(
    "args",
    [
        (b"ps", b"--tag", b"caf\xe9"),
        (b"show", b"\xff\xfe"),
        (b"stop", b"abc", b"--reason", b"caf\xe9"),
        (b"ps", b"--name", b"\xed\xa0\x80"),
    ],
)
def test_arguments_that_are_not_utf8_are_a_one_line_usage_error(
    tmp_path: Path, args: tuple[bytes, ...]
) -> None:
    db = tmp_path / "t.db"
    SqliteTaskStore(db).close()
    result = subprocess.run(
        [sys.executable.encode(), b"-m", b"chongming_task", b"--db", str(db).encode(), *args],
        capture_output=True,
        timeout=60,
    )
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert stderr.count("\n") == 1 and "not valid UTF-8" in stderr, stderr
    assert "Traceback" not in stderr and result.stdout == b""


def _store_with_one_task(db: Path) -> None:
    """A SQLite file at ``db`` holding one queued task, ``t1``."""
    store = SqliteTaskStore(db)
    store.create(
        TaskSnapshot(
            task_id="t1",
            name="n",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=datetime.now(UTC),
        )
    )
    store.close()


def test_commands_other_than_migrate_leave_an_older_file_as_it_is(tmp_path: Path) -> None:
    """A newer CLI against a file of an older schema (a fleet not upgraded yet): ``ps``,
    ``show``, ``stop`` and the rest refuse with one line that says what to do, and leave
    the file untouched, since nodes of the older release could not use it upgraded (and
    some upgrades rebuild the trail while every process waits); ``migrate`` upgrades it."""
    from chongming_task.stores.sqlite import SCHEMA_VERSION

    db = tmp_path / "old.db"
    _store_with_one_task(db)
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    raw.commit()
    raw.close()
    before = db.read_bytes()
    for args in (("ps", "--all"), ("show", "t1"), ("stop", "t1"), ("stats",)):
        result = cli(db, *args, check=False)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr
        assert f"has schema {SCHEMA_VERSION - 1}, older" in result.stderr, result.stderr
        assert "migrate" in result.stderr and "Traceback" not in result.stderr
        assert db.read_bytes() == before, args
    cli(db, "migrate")
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()
    assert "t1" in cli(db, "ps", "--all").stdout


_HOLD_WRITE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE tasks SET attempt = attempt")
print("locked", flush=True)
time.sleep(60)
"""


def test_read_commands_read_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    """``ps`` once ran the schema migration's ``BEGIN IMMEDIATE`` on open: it queued behind
    any writer and failed after the 30 s busy timeout, and rewrote the header of a file
    it only read. Under WAL a reader never waits for a writer."""
    db = tmp_path / "busy.db"
    _store_with_one_task(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_WRITE_LOCK, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = db.read_bytes()
        for args in (("ps", "--all"), ("show", "t1"), ("stats",), ("history", "t1")):
            started = time.monotonic()
            result = cli(db, *args)
            assert time.monotonic() - started < 10, f"{args} waited for the writer"
            assert result.returncode == 0
        assert "t1" in cli(db, "ps", "--all").stdout
        assert db.read_bytes() == before  # reading wrote nothing to the file
    finally:
        holder.kill()
        holder.wait(10)


def test_prune_keeps_the_newest_finished_tasks(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    store = SqliteTaskStore(db)
    base = datetime.now(UTC) - timedelta(hours=1)
    for i, status in enumerate([TaskStatus.SUCCEEDED] * 3 + [TaskStatus.RUNNING]):
        store.create(
            TaskSnapshot(
                task_id=f"t{i}",
                name="n",
                status=status,
                status_version=1,
                created_at=base + timedelta(seconds=i),
            )
        )
    store.close()
    said = cli_json(db, "prune", "--keep", "1")
    assert isinstance(said, dict) and said["pruned"] == 2
    assert said["file_bytes"] == db.stat().st_size  # with the file's free pages beside
    assert sorted(r["task_id"] for r in cli_json(db, "ps", "--all")) == ["t2", "t3"]  # type: ignore[union-attr,index]


def test_ps_pipeline_lists_one_pipeline_run(tmp_path: Path) -> None:
    from chongming_task import Controller, Pipeline

    db = tmp_path / "p.db"
    with Controller(db) as node:
        node.task(lambda token, x: x, name="value")
        node.task(lambda token: sum(token.upstream.values()), name="add")
        pipe = Pipeline("tiny")
        pipe.add("a", "value", args=(1,))
        pipe.add("b", "add", depends_on=["a"])
        run = node.submit_pipeline(pipe)
        other = node.submit_pipeline(pipe)
        run.wait(10)
        other.wait(10)
    rows = cli_json(db, "ps", "--all", "--pipeline", run.pipeline_run_id)
    ids = {r["task_id"] for r in rows}  # type: ignore[union-attr,index]
    assert ids == {r.task_id for r in run.nodes.values()}
    assert {r["pipeline_run_id"] for r in rows} == {run.pipeline_run_id}  # type: ignore[union-attr,index]


def test_ps_node_lists_one_nodes_tasks(tmp_path: Path) -> None:
    from chongming_task import Controller

    db = tmp_path / "n.db"
    ids: dict[str, set[str]] = {}
    for owner in ("node-a", "node-b"):
        with Controller(db, owner=owner) as node:
            job = node.task(lambda token: None, name="job")
            runs = [node.submit(job) for _ in range(3)]
            for r in runs:
                r.wait(10)
            ids[owner] = {r.task_id for r in runs}
    rows = cli_json(db, "ps", "--all", "--node", "node-a")
    assert {r["task_id"] for r in rows} == ids["node-a"]  # type: ignore[union-attr,index]
    assert cli_json(db, "ps", "--all", "--node", "node") == []  # exact, not a prefix
