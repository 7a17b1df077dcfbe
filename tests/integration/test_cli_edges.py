"""What a new user types and what they are shown: global flags after the command,
``--version``, ids in upper case, a finished task's lease, one name glob in the CLI and
the dashboard. The CLI and the dashboard run as real processes on a SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus
from tests.integration.test_web import Web

NOW = datetime.now(UTC)
NAMES = {"etl.load": "a1", "etl.extract": "b2", "etl": "c3", "report": "d4"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def task(name: str, digit: str, status: TaskStatus) -> TaskSnapshot:
    ended = NOW if status is TaskStatus.FAILED else None
    return TaskSnapshot(
        task_id=f"{digit}c0ffee{digit}" + "0" * 22,
        name=name,
        status=status,
        status_version=1,
        created_at=NOW - timedelta(minutes=5),
        started_at=ended,
        ended_at=ended,
        owner="demo:1",
        lease_owner="demo:1",
        lease_until=NOW - timedelta(minutes=4),  # long past: a finished task's stale lease
    )


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "edges.db"
    store = SqliteTaskStore(path)
    for name, digit in NAMES.items():
        status = TaskStatus.FAILED if name == "report" else TaskStatus.QUEUED
        store.create(task(name, digit, status))
    store.close()
    yield path


def ids(out: str) -> list[str]:
    return sorted(row["name"] for row in json.loads(out))


def test_global_flags_work_after_the_command_and_version_answers(db: Path) -> None:
    before = run("--db", str(db), "--json", "ps")
    after = run("ps", "--db", str(db), "--json")
    assert before.returncode == after.returncode == 0, after.stderr
    assert ids(after.stdout) == ids(before.stdout) == ["etl", "etl.extract", "etl.load"]
    mixed = run("--json", "ps", "--all", "--db", str(db), "--name", "report")
    assert ids(mixed.stdout) == ["report"]
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("chongming-task ")
    assert version.stdout.split()[1][0].isdigit(), version.stdout


def test_an_id_in_upper_case_finds_its_task(db: Path) -> None:
    full = task("report", "d4", TaskStatus.FAILED).task_id
    for given in (full.upper(), full[:10].upper()):
        shown = run("--db", str(db), "show", given)
        assert shown.returncode == 0, shown.stderr
        assert full in shown.stdout
    missing = run("--db", str(db), "show", "FFFFFFFFFF")
    assert missing.returncode == 1 and "no task" in missing.stderr


def test_a_finished_task_shows_no_lease(db: Path) -> None:
    finished = task("report", "d4", TaskStatus.FAILED).task_id
    waiting = task("etl", "c3", TaskStatus.QUEUED).task_id
    lease_line = [
        line for line in run("--db", str(db), "show", finished).stdout.splitlines()
        if line.startswith("lease")
    ]  # fmt: skip
    assert lease_line and lease_line[0].split(None, 1)[1] == "none (finished)"
    unfinished = run("--db", str(db), "show", waiting).stdout
    assert "demo:1 until" in unfinished  # an unfinished task's lease is still told
    web = Web(db)
    try:
        status, page = web.get(f"/tasks/{finished}/live")
        assert status == 200 and "none (finished)" in page and "EXPIRED" not in page
        status, page = web.get(f"/tasks/{waiting}/live")
        assert status == 200 and "EXPIRED" in page
    finally:
        web.close()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("etl", ["etl"]),
        ("etl.*", ["etl.extract", "etl.load"]),
        ("etl*", ["etl", "etl.extract", "etl.load"]),
        ("*.load", ["etl.load"]),
        ("ETL*", []),
    ],
)
def test_one_name_glob_in_the_cli_and_the_dashboard(
    db: Path, name: str, expected: list[str]
) -> None:
    listed = run("--db", str(db), "--json", "ps", "--all", "--name", name)
    assert listed.returncode == 0, listed.stderr
    assert ids(listed.stdout) == expected
    web = Web(db)
    try:
        status, page = web.get(f"/tasks?status=all&name={name}")
        assert status == 200
        shown = sorted(n for n, digit in NAMES.items() if f"{digit}c0ffee{digit}" in page)
        assert shown == expected, page
    finally:
        web.close()


def test_every_name_and_tag_given_is_taken_not_the_last_alone(tmp_path: Path) -> None:
    path = tmp_path / "tagged.db"
    store = SqliteTaskStore(path)
    tagged = {"etl.load": {"io"}, "etl.extract": {"cpu"}, "etl": {"io", "cpu"}, "report": set()}
    for name, digit in NAMES.items():
        store.create(replace(task(name, digit, TaskStatus.QUEUED), tags=frozenset(tagged[name])))
    store.close()
    db = str(path)
    assert ids(run("--db", db, "--json", "ps", "--name", "etl", "--name", "report").stdout) == [
        "etl",
        "report",
    ]
    # Globs that overlap: each task once.
    assert ids(run("--db", db, "--json", "ps", "--name", "etl*", "--name", "*.load").stdout) == [
        "etl",
        "etl.extract",
        "etl.load",
    ]
    assert ids(run("--db", db, "--json", "ps", "--tag", "io", "--tag", "cpu").stdout) == [
        "etl",
        "etl.extract",
        "etl.load",
    ]
    # Names and tags together: any of the names, and any of the tags.
    both = run("--db", db, "--json", "ps", "--name", "etl", "--name", "report", "--tag", "io")
    assert ids(both.stdout) == ["etl"]
    # A control by selection takes them all too.
    dry = run("--db", db, "--json", "stop", "--name", "etl.load", "--name", "report", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["selected"] == 2


def test_ps_shows_the_newest_hundred_and_says_how_many_more(tmp_path: Path) -> None:
    from chongming_task.model import Transition
    from chongming_task.stores.capabilities import Capabilities

    path = tmp_path / "many.db"
    store = SqliteTaskStore(path)
    items = []
    for n in range(130):
        snapshot = TaskSnapshot(
            task_id=f"{n:032x}",
            name="job",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=NOW - timedelta(seconds=n),  # task 0 is the newest
            bucket=n % 4,
        )
        made = Transition(
            task_id=snapshot.task_id,
            version=1,
            from_status=None,
            to_status=TaskStatus.QUEUED,
            at=snapshot.created_at,
        )
        items.append((snapshot, made))
    Capabilities(store).create_many(items)
    store.close()
    shown = run("--db", str(path), "ps")
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if line.startswith("0000")]
    assert len(rows) == 100 and rows[0].split()[0] == "000000000000"
    assert "... and 30 more (the newest 100 are shown)" in shown.stdout
    assert "--limit 0 for all" in shown.stdout
    listed = run("--db", str(path), "--json", "ps", "--bucket", "1")
    assert len(json.loads(listed.stdout)) == 33 and listed.stderr == ""  # all: no line
    every = run("--db", str(path), "--json", "ps", "--limit", "0")
    assert len(json.loads(every.stdout)) == 130
    capped = run("--db", str(path), "--json", "ps")
    assert len(json.loads(capped.stdout)) == 100 and "30 more" in capped.stderr


@pytest.mark.parametrize(
    "given",
    [
        ["--db", "postgresql://app:hunter2-long@127.0.0.1:1/ops"],
        ["--db=postgresql://app@127.0.0.1:1/ops?password=hunter2-long"],
        ["--db", "host=127.0.0.1 port=1 dbname=ops password=hunter2-long"],
        ["--pg-listen-dsn", "postgresql://app:hunter2-long@127.0.0.1:1/ops"],
    ],
)
def test_a_password_on_the_command_line_is_refused_and_taken_from_the_environment(
    given: list[str],
) -> None:
    refused = run(*given, "ps")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "readable by every user of this machine" in refused.stderr
    assert "CHONGMING_DB" in refused.stderr and "hunter2" not in refused.stderr
    # The same DSN from the environment is taken (and then finds nothing listening).
    taken = subprocess.run(
        [sys.executable, "-m", "chongming_task", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CHONGMING_DB": "postgresql://app:hunter2-long@127.0.0.1:1/ops"},
    )
    assert taken.returncode == 1 and "nothing listens there" in taken.stderr, taken.stderr
