"""The command line against careless and hostile input, as real processes: numbers too
large, NaN and infinity, bucket flags that would exhaust memory, schemes and schema
names no store takes, passwords in every DSN form, and names made of terminal escapes.
Each answer is one line on stderr and exit 2 (or the result), never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus

HOSTILE = "\x1b[31mRED\x1b]0;pwned\x07\nnext\u202eline\x9b"


def cli(*args: str, timeout: float = 60, db: str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI; ``db``: a store given in the environment (a DSN's password is refused as
    an argument)."""
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if db is None else {**os.environ, "CHONGMING_DB": db},
    )


def one_line_usage_error(result: subprocess.CompletedProcess[str], said: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert said in result.stderr, result.stderr


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "careless.db"
    store = SqliteTaskStore(path)
    store.create(
        TaskSnapshot(
            task_id="abcdef" + "0" * 26,
            name=HOSTILE,
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=datetime.now(UTC),
            tags=frozenset({HOSTILE}),
            bucket=3,
            bucket_key=HOSTILE,
        )
    )
    store.close()
    return path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["ps", "--older-than", "999999999w"], "longer than a century"),
        (["ps", "--older-than", "3000000d"], "longer than a century"),
        (["ps", "--limit", "9223372036854775808"], "argument --limit"),
        (["history", "abcdef", "--since", "1e20"], "argument --since"),
        (["doctor", "--stale-after", "inf"], "argument --stale-after"),
        (["doctor", "--limit", "-1"], "argument --limit"),
        (["prune", "--keep", "1e20"], "argument --keep"),
        (["doctor", "--orphan-after", "nan"], "argument --orphan-after"),
        (["watch", "--interval", "nan"], "argument --interval"),
        (["stop", "abcdef", "--wait", "nan"], "argument --wait"),
        (["demo", "--duration", "nan"], "argument --duration"),
        (["--num-buckets", "99999999999", "buckets", "--all"], "65,536"),
        (["--owned-buckets", "0-99999999999", "ps", "--mine"], "out of range"),
        (["--pg-schema", "sec2\n", "ps"], "schema name"),
        (["--pg-schema", "information_schema", "ps"], "PostgreSQL's own"),
    ],
)
def test_bad_numbers_and_names_are_one_line_usage_errors(
    db: Path, args: list[str], said: str
) -> None:
    one_line_usage_error(cli("--db", str(db), *args), said)


def test_an_unsupported_scheme_is_named() -> None:
    result = cli("--db", "mysql://x@y/z", "ps")
    one_line_usage_error(result, "unsupported scheme mysql")
    assert "no database at" not in result.stderr


def test_the_largest_bucket_count_answers_in_bounded_time(db: Path) -> None:
    result = cli("--db", str(db), "--num-buckets", "65536", "--json", "buckets", "--all")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["buckets"]) == 65536


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres@127.0.0.1:1/db?password=sekrit",
        "postgresql://postgres:sekrit@127.0.0.1:1/db",
        "host=127.0.0.1 port=1 password=sekrit dbname=db",
        "postgresql://postgres:se@sekrit@127.0.0.1:1/db",
    ],
)
def test_a_dsn_password_is_never_printed(dsn: str) -> None:
    pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")
    for args in (["ps"], ["show", "abcdef"], ["doctor"]):
        result = cli(*args, db=dsn)
        assert result.returncode == 1, result.stderr
        assert "sekrit" not in result.stdout + result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert "127.0.0.1" in result.stderr  # it still says where it looked


def test_a_key_value_dsn_is_postgresql_not_a_file(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", "host=127.0.0.1 port=1 dbname=x", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "PostgreSQL" in result.stderr and "no database at" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no SQLite file made of the words


def test_names_made_of_terminal_escapes_are_shown_escaped(db: Path) -> None:
    for args in (["ps"], ["show", "abcdef"], ["watch", "--count", "1"], ["ps", "--json"]):
        result = cli("--db", str(db), *args)
        assert result.returncode == 0, result.stderr
        out = result.stdout
        for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
            assert raw not in out, (args, out)
        assert "RED" in out
    table = cli("--db", str(db), "ps").stdout.splitlines()
    assert len(table) == 2, table  # the header and one row: the newline did not split it
    shown = cli("--db", str(db), "--json", "ps").stdout
    assert json.loads(shown)[0]["name"] == HOSTILE  # the JSON still says what is stored


def test_an_unknown_id_made_of_escapes_is_echoed_escaped(db: Path) -> None:
    result = cli("--db", str(db), "show", "\x1b]0;pwned\x07abc")
    assert result.returncode == 1
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _stored(path: Path, *snapshots: TaskSnapshot) -> None:
    store = SqliteTaskStore(path)
    try:
        for snapshot in snapshots:
            store.create(snapshot)
    finally:
        store.close()


def _task(n: int, status: TaskStatus) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=f"{n:02d}" + "c" * 30,
        name="job",
        status=status,
        status_version=2,
        created_at=datetime.now(UTC),
        lease_owner=None if status in (TaskStatus.QUEUED, TaskStatus.SUCCEEDED) else "gone:1",
    )


def test_ps_with_a_limit_says_how_many_more(tmp_path: Path) -> None:
    db = tmp_path / "more.db"
    _stored(db, *(_task(n, TaskStatus.QUEUED) for n in range(8)))
    result = cli("--db", str(db), "ps", "--all", "--limit", "5")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("job") == 5
    assert "... and 3 more (the newest 5 are shown)" in result.stdout
    assert "more" not in cli("--db", str(db), "ps", "--limit", "8").stdout


def test_a_selection_never_counts_finished_tasks(tmp_path: Path) -> None:
    db = tmp_path / "finished.db"
    _stored(
        db,
        *(_task(n, TaskStatus.SUCCEEDED) for n in range(3)),
        *(_task(n, TaskStatus.QUEUED) for n in range(3, 5)),
    )
    result = cli("--db", str(db), "pause", "--all", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would pause 2 task(s)" in result.stdout
    one_line_usage_error(
        cli("--db", str(db), "pause", "--status", "succeeded", "--dry-run"), "unfinished"
    )


def test_wait_on_a_task_already_on_its_way_waits_and_says_what_it_saw(tmp_path: Path) -> None:
    db = tmp_path / "onitsway.db"
    pausing, stopping = _task(1, TaskStatus.PAUSING), _task(2, TaskStatus.STOPPING)
    _stored(db, pausing, stopping)
    paused = cli("--db", str(db), "pause", pausing.task_id, "--wait", "1")
    assert paused.returncode == 1, paused.stdout  # it waited: nothing paused it
    assert "already pausing" in paused.stderr and "still pausing after 1" in paused.stderr
    stopped = cli("--db", str(db), "stop", stopping.task_id, "--wait", "1")
    assert stopped.returncode == 1
    assert "already stopping" in stopped.stderr and "still stopping after 1" in stopped.stderr
    assert "stays queued" not in stopped.stderr  # no request was queued


def _malformed(path: Path) -> dict[str, str]:
    """A file holding a readable task and three rows someone else wrote: a time that is
    none, a status no release has, a result nested too deep to read. Their ids by name."""
    import sqlite3

    store = SqliteTaskStore(path)
    now = datetime.now(UTC)
    ids = {name: f"{n:02d}" + "f" * 30 for n, name in enumerate(("good", "date", "status", "deep"))}
    for name, task_id in ids.items():
        store.create(
            TaskSnapshot(
                task_id=task_id,
                name=name,
                status=TaskStatus.SUCCEEDED,
                status_version=1,
                created_at=now,
                outcome={"x": 1},
            )
        )
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE tasks SET created_at = 'not a date' WHERE name = 'date'")
    raw.execute("UPDATE tasks SET status = 'bogus' WHERE name = 'status'")
    raw.execute(
        "UPDATE tasks SET outcome = ? WHERE name = 'deep'", ("[" * 200_000 + "]" * 200_000,)
    )
    raw.commit()
    raw.close()
    return ids


def test_a_malformed_row_is_one_line_naming_its_task_and_field_and_the_rest_is_shown(
    tmp_path: Path,
) -> None:
    path = tmp_path / "malformed.db"
    ids = _malformed(path)
    db = str(path)
    listed = cli("--db", db, "--json", "ps", "--all")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert sorted(t["name"] for t in json.loads(listed.stdout)) == ["deep", "good"]
    said = listed.stderr.strip().splitlines()
    assert said == [
        f"task {ids['date']}: its created_at 'not a date' cannot be read (Invalid isoformat "
        "string: 'not a date'): left out of the list",
        f"task {ids['status']}: its status 'bogus' cannot be read ('bogus' is not a valid "
        "TaskStatus): left out of the list",
    ]
    for name, field in (("date", "created_at"), ("status", "status"), ("deep", "outcome")):
        for command in ("show", "history"):
            shown = cli("--db", db, command, ids[name][:8])
            assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stderr
            (line,) = shown.stderr.strip().splitlines()
            assert line.startswith(f"chongming-task: error: task {ids[name]}: its {field} ")
    assert "nested too deep" in cli("--db", db, "show", ids["deep"]).stderr
    stats = cli("--db", db, "stats")
    assert stats.returncode == 0 and "Traceback" not in stats.stderr
    assert "1 task(s) in a status this release does not know: 'bogus'" in stats.stderr
    assert cli("--db", db, "show", ids["good"]).returncode == 0


def test_the_dashboard_starts_and_serves_beside_a_malformed_row(tmp_path: Path) -> None:
    from tests.integration.test_web import Web

    path = tmp_path / "malformed.db"
    ids = _malformed(path)
    web = Web(path)
    try:
        for page in ("/", "/tasks?status=all", f"/tasks/{ids['good']}", f"/tasks/{ids['deep']}"):
            status, body = web.get(page)
            assert status == 200, (page, status)
        status, body = web.get("/tasks?status=all")
        assert ids["good"][:12] in body and ids["date"][:12] not in body
        status, body = web.get(f"/tasks/{ids['date']}")
        assert status == 503 and "its created_at &#39;not a date&#39; cannot be read" in body
    finally:
        web.close()
