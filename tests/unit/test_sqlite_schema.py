"""SQLite's schema and trail: the tables match the codec, each transition keeps its own
time, and files of every earlier schema are upgraded in place with their tasks and
trail, in the order tasks were made."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chongming_task import (
    StoreError,
    TaskQuery,
    TaskStatus,
    Transition,
)
from chongming_task.stores import SqliteTaskStore, codec
from chongming_task.stores.sqlite import SCHEMA_VERSION
from tests.unit.sqlite_support import (
    life_step,
    new_task,
    queued_write_errors,
    rows_into_the_tables,
    snap,
    sql,
)


def test_the_schema_in_sqlite_sql_matches_the_codec(tmp_path: Path) -> None:
    """The statements live in stores/sqlite/schema.sql and queries.sql as SQL; the codec
    and the group commit build rows in their own column order. A column added to one and
    not the other fails here, not as a silently shifted row."""
    import re

    from chongming_task.states import TERMINAL
    from chongming_task.stores import codec
    from chongming_task.stores.sql import load_named
    from chongming_task.stores.sqlite.group import LIFE_FILLS, NEW_FILLS, WRITE_VIEW_COLUMNS

    store = SqliteTaskStore(tmp_path / "s.db")
    store.close()
    raw = sqlite3.connect(tmp_path / "s.db")
    try:

        def columns(table: str) -> tuple[str, ...]:
            return tuple(r[1] for r in raw.execute(f"PRAGMA table_info({table})"))

        # seq (schema 9) is the store's own: the codec's rows never carry it. The result
        # is the row's last column (schema 16: nothing else is read past it), after its
        # generated preview (which table_info does not list).
        rest = tuple(c for c in codec.TASK_COLUMNS if c != "outcome")
        assert columns("tasks") == ("seq", *rest, "outcome")
        every = tuple(r[1] for r in raw.execute("PRAGMA table_xinfo(tasks)"))
        assert every[-2:] == ("outcome_preview", "outcome")
        # key (schema 11) is the store's own too: seq * 16777216 + version.
        assert columns("transitions") == ("key", *codec.TRANSITION_COLUMNS)
        assert columns("commands") == codec.COMMAND_COLUMNS
        assert columns("task_writes") == WRITE_VIEW_COLUMNS
        # A life row binds only LIFE_FILLS (the rest is NULL in the statement): a column
        # the trigger reads and the row leaves out would be written NULL, silently.
        (life,) = raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'"
        ).fetchone()
        assert set(re.findall(r"NEW\.(\w+)", life)) == {"kind", *LIFE_FILLS}
        (new,) = raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_new'"
        ).fetchone()
        assert set(re.findall(r"NEW\.(\w+)", new)) == {"kind", *NEW_FILLS}
    finally:
        raw.close()
    statements = load_named("chongming_task.stores.sqlite")
    claims = ("open_commands_for", "pulse_node")
    for name in ("prunable", "touch_task", "renew_lease", "write_activity", *claims):
        assert set(re.findall(r"'(\w+)'", statements[name])) == {s.value for s in TERMINAL}
    pg = load_named("chongming_task.stores.postgres")
    for name in (*claims, "notify_command"):
        assert set(re.findall(r"'(\w+)'", pg[name])) == {s.value for s in TERMINAL}
    assert statements["get_task"].split("FROM")[0].replace("\n", " ").split() == [
        "SELECT",
        *(f"{c}," for c in codec.TASK_COLUMNS[:-1]),
        codec.TASK_COLUMNS[-1],
    ]


def test_a_life_write_stores_each_transition_at_its_own_time() -> None:
    """A worker's start and end transitions share the snapshot's started_at and ended_at
    objects, and the life write encodes each of those times once: a transition at any
    other time still gets its own."""
    from datetime import timedelta

    from chongming_task.stores import codec
    from chongming_task.stores.sqlite.group import LIFE_FILLS
    from chongming_task.stores.sqlite.store import _life_request

    started = datetime(2026, 3, 1, 12, 0, 0, 1, tzinfo=UTC)
    ended = started + timedelta(seconds=2)
    between = started + timedelta(seconds=1)  # equal to neither, nor the same object
    snapshot = snap(
        "t1", status=TaskStatus.SUCCEEDED, status_version=5, started_at=started, ended_at=ended
    )
    statuses = [TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED]
    ats = [started, between, ended]
    transitions = [
        Transition(task_id="t1", version=v, from_status=None, to_status=to, at=at)
        for v, to, at in zip((3, 4, 5), statuses, ats, strict=True)
    ]
    request = _life_request(snapshot, 2, transitions)
    (life,) = request.life
    trail_at, life_at = codec.TRANSITION_COLUMNS.index("at"), LIFE_FILLS.index("at")
    stored = [row[trail_at] for row in request.trail] + [life[life_at]]
    assert stored == [codec.encode_dt(at) for at in ats]
    assert life[LIFE_FILLS.index("started_at")] == codec.encode_dt(started)
    assert life[LIFE_FILLS.index("ended_at")] == codec.encode_dt(ended)


def _schema_8_file(path: Path) -> sqlite3.Connection:
    """A file as a release of schema 8 made it (``data/sqlite_schema_8.sql``): tasks
    without seq, the trail keyed by (task_id, version). It holds task "kept" with its
    first transition, a trail row of a task it does not hold ("loose"), and task
    "later" made after a task that was pruned (so rowids have a gap). Open, for the
    caller to age further and commit."""
    from chongming_task.stores import codec

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 1024")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript((Path(__file__).parent / "data" / "sqlite_schema_8.sql").read_text())
    columns = [c for c in codec.TASK_COLUMNS if c not in (*codec.OPTION_COLUMNS, "trace_context")]
    marks = ", ".join("?" * len(columns))
    trail_marks = ", ".join("?" * len(codec.TRANSITION_COLUMNS))
    for task_id in ("kept", "pruned", "later"):
        snapshot, created = new_task(task_id)
        conn.execute(
            f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({marks})",
            codec.snapshot_to_values(snapshot)[: len(columns)],
        )
        conn.execute(
            f"INSERT INTO transitions VALUES ({trail_marks})",
            codec.transition_to_values(created),
        )
    conn.execute("DELETE FROM tasks WHERE task_id = 'pruned'")
    conn.execute("DELETE FROM transitions WHERE task_id = 'pruned'")
    loose = replace(new_task("loose")[1], reason="appended before its create")
    conn.execute(
        f"INSERT INTO transitions VALUES ({trail_marks})", codec.transition_to_values(loose)
    )
    conn.execute("PRAGMA user_version = 8")
    return conn


@pytest.mark.parametrize(
    ("version", "dropped"),
    [
        (
            1,
            (
                "nodes",
                "node_buckets",
                "schedules",
                "pipelines",
                "idx_commands_finished",
                "idx_tasks_owner",
            ),
        ),
        (2, ("schedules", "pipelines", "idx_commands_finished", "idx_tasks_owner")),
        (3, ("pipelines", "idx_commands_finished", "idx_tasks_owner")),
        (4, ("idx_commands_finished", "idx_tasks_owner")),
        (5, ("idx_tasks_owner",)),
        (6, ()),
        (7, ()),
        (8, ()),
    ],
)
def test_an_older_file_gains_the_new_tables_when_opened(
    tmp_path: Path, version: int, dropped: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    """Files made before node declarations (schema 1), schedule records (schema 2), ...
    or the trail keyed by seq (schema 9) are upgraded in place, their tasks and every
    trail row kept, each task keeping its place in the order tasks were made."""
    path = tmp_path / f"v{version}.db"
    conn = _schema_8_file(path)
    for name in dropped:
        kind = "INDEX" if name.startswith("idx_") else "TABLE"
        conn.execute(f"DROP {kind} {name}")
    if version < 8:  # before schema 8 the life trigger did not carry the last transition
        (life,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'"
        ).fetchone()
        conn.execute("DROP TRIGGER task_writes_life")
        life = life[: life.index("INSERT OR IGNORE INTO transitions")] + "END"
        if version < 6:  # ... and before schema 6 it also wrote owner
            life = life.replace(
                "attempt = NEW.attempt,", "attempt = NEW.attempt, owner = NEW.owner,"
            )
        conn.execute(life)
    if version < 7:  # before schema 7 a new task's row did not carry its first transition
        (new,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_new'"
        ).fetchone()
        conn.execute("DROP TRIGGER task_writes_new")
        conn.execute(new[: new.index("INSERT OR IGNORE INTO transitions")] + "END")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    with caplog.at_level("WARNING", logger="chongming_task.store"):
        reopened = SqliteTaskStore(path, create=False)
    # The rebuild takes a while on a large file: it says so, once, with the count.
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: upgrading to schema {SCHEMA_VERSION}, which copies its 2 tasks and their "
        "trail once (about 40 s a million tasks); other processes wait for the file"
    ]
    try:
        assert reopened.get("kept") is not None
        assert reopened.nodes() == [] and reopened.schedules() == []
        (now,) = sql(reopened).execute("PRAGMA user_version").fetchone()
        assert now == SCHEMA_VERSION == 16
        assert reopened.holds() == {}  # schema 15: the holds of a pause before the start
        # Schema 12: what nodes say of their health, and the late reports beside tasks.
        assert "health" in [r[1] for r in sql(reopened).execute("PRAGMA table_info(nodes)")]
        assert reopened.late_reports() == []
        fresh = sqlite3.connect(":memory:")  # the copy's own settings were undone
        for pragma in ("PRAGMA cache_size", "PRAGMA secure_delete"):
            assert sql(reopened).execute(pragma).fetchone() == fresh.execute(pragma).fetchone()
        fresh.close()
        assert reopened.pipeline_records() == []
        # Each task kept its rowid as its seq; the loose trail row waits in a table of
        # its own (schema 10).
        assert sql(reopened).execute("SELECT task_id, seq FROM tasks ORDER BY seq").fetchall() == [
            ("kept", 1),
            ("later", 3),
        ]
        assert sql(reopened).execute(
            "SELECT key / 16777216, task_id, version FROM transitions"
        ).fetchall() == [(1, "kept", 1), (3, "later", 1)]
        assert sql(reopened).execute(
            "SELECT task_id, version FROM loose_transitions"
        ).fetchall() == [("loose", 1)]
        assert [t.version for t in reopened.history("kept")] == [1]
        assert [t.reason for t in reopened.history("loose")] == ["appended before its create"]
        (life,) = (
            sql(reopened)
            .execute("SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'")
            .fetchone()
        )
        assert "owner" not in life and "seq" in life  # made again, as this version writes it
        reopened.create_many([new_task("after")])  # its row carries its first transition
        moved, trail = life_step("after", 2)
        reopened.write_transitions(moved, expect_version=1, transitions=trail)  # its last
        assert [t.version for t in reopened.history("after")] == [1, 2]
        (after,) = sql(reopened).execute("SELECT seq FROM tasks WHERE task_id = 'after'").fetchone()
        assert after == 4
        reopened.create_many([new_task("loose")])  # adopts the row appended before it
        assert [t.reason for t in reopened.history("loose")] == ["appended before its create"]
        assert sql(reopened).execute("SELECT * FROM loose_transitions").fetchall() == []
        assert reopened.query(TaskQuery(owner="nobody")) == []
        for index, query in [
            ("idx_tasks_owner", "SELECT task_id FROM tasks WHERE owner = ? ORDER BY created_at"),
            ("idx_tasks_status", "SELECT task_id FROM tasks WHERE status = ?"),
            ("sqlite_autoindex_tasks", "SELECT seq FROM tasks WHERE task_id = ?"),
        ]:
            plan = " ".join(
                str(row[-1]) for row in sql(reopened).execute("EXPLAIN QUERY PLAN " + query, ["n"])
            )
            assert index in plan, plan
    finally:
        reopened.close()


def test_the_loose_trail_is_found_without_reading_every_task(tmp_path: Path) -> None:
    """The loose trail is nearly always empty, and tasks may be a million rows: each
    statement that reads it is driven by it, a lookup in tasks per loose row (planned
    the other way round, adopting after a bulk create read every task)."""
    from chongming_task.stores.sql import load_named

    statements = load_named("chongming_task.stores.sqlite")
    store = SqliteTaskStore(tmp_path / "plans.db")
    try:
        store.create_many([new_task(f"t{i}") for i in range(100)])
        values = ["t1", 0, None, "queued", "2026-01-01", None, None]  # a trail row's
        arity = {"adopt_loose": 0, "adopt_loose_done": 0, "append_loose": 7, "history": 2}

        def check_plans() -> None:
            for name, taken in arity.items():
                explained = sql(store).execute(
                    f"EXPLAIN QUERY PLAN {statements[name]}", values[:taken]
                )
                plan = [str(row[-1]) for row in explained]
                for step in plan:  # tasks (alias t) only ever looked up by one id
                    if "tasks" in step or step.split()[1:2] == ["t"]:
                        assert step.startswith("SEARCH") and "(task_id=?)" in step, (name, plan)
                    assert not step.startswith("SCAN transitions"), (name, plan)

        check_plans()  # as a store plans them: no statistics
        sql(store).execute("ANALYZE")  # and after someone ran ANALYZE
        check_plans()
    finally:
        store.close()


def _seq_keyed_trail(raw: sqlite3.Connection) -> None:
    """Make a file's trail the table of schemas 9 and 10: keyed (seq, task_id, version),
    WITHOUT ROWID (the view's triggers go: the migration makes them again)."""
    for trigger in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        raw.execute(f"DROP TRIGGER {trigger}")
    raw.execute(
        "CREATE TABLE old_trail (seq INTEGER NOT NULL, task_id TEXT NOT NULL, "
        "version INTEGER NOT NULL, from_status TEXT, to_status TEXT NOT NULL, at TEXT NOT "
        "NULL, reason TEXT, actor TEXT, PRIMARY KEY (seq, task_id, version)) WITHOUT ROWID"
    )
    raw.execute(
        "INSERT INTO old_trail SELECT key / 16777216, task_id, version, from_status, "
        "to_status, at, reason, actor FROM transitions"
    )
    raw.execute("DROP TABLE transitions")
    raw.execute("ALTER TABLE old_trail RENAME TO transitions")


@pytest.mark.parametrize("version", [9, 10])
def test_a_file_with_the_trail_keyed_by_seq_is_rebuilt_once(
    tmp_path: Path, version: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Schemas 9 and 10 keyed the trail by (seq, task_id, version); schema 9 also kept
    the trail of tasks not held there, under seq 0. Opening such a file rebuilds the
    trail once into the rowid table of schema 11, every row kept: a held task's under
    its key, a row of a task not held in loose_transitions."""
    from chongming_task.stores import codec

    path = tmp_path / f"v{version}.db"
    made = SqliteTaskStore(path)
    made.create_many([new_task("kept"), new_task("other")])
    moved, trail = life_step("kept", 2)
    made.write_transitions(moved, expect_version=1, transitions=trail)
    made.close()
    raw = sqlite3.connect(path)
    _seq_keyed_trail(raw)
    loose = replace(new_task("loose")[1], reason="appended before its create")
    if version == 9:
        raw.execute("DROP TABLE loose_transitions")
        raw.execute(
            "INSERT INTO transitions VALUES (0, ?, ?, ?, ?, ?, ?, ?)",
            codec.transition_to_values(loose),
        )
    else:  # schema 10's loose table, without the CHECK on versions
        raw.execute("DROP TABLE loose_transitions")
        raw.execute(
            "CREATE TABLE loose_transitions (task_id TEXT NOT NULL, version INTEGER NOT NULL, "
            "from_status TEXT, to_status TEXT NOT NULL, at TEXT NOT NULL, reason TEXT, "
            "actor TEXT, PRIMARY KEY (task_id, version)) WITHOUT ROWID"
        )
        raw.execute(
            "INSERT INTO loose_transitions VALUES (?, ?, ?, ?, ?, ?, ?)",
            codec.transition_to_values(loose),
        )
    raw.execute(f"PRAGMA user_version = {version}")
    raw.commit()
    raw.close()
    with caplog.at_level("WARNING", logger="chongming_task.store"):
        store = SqliteTaskStore(path, create=False)
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: upgrading to schema {SCHEMA_VERSION}, which copies its 2 tasks and "
            "their trail once (about 40 s a million tasks); other processes wait for the file"
        ]
        assert sql(store).execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert sql(store).execute(
            "SELECT key, task_id, version FROM transitions ORDER BY key"
        ).fetchall() == [
            (16777216 + 1, "kept", 1),
            (16777216 + 2, "kept", 2),
            (2 * 16777216 + 1, "other", 1),
        ]
        assert [t.version for t in store.history("kept")] == [1, 2]
        assert [t.reason for t in store.history("loose")] == ["appended before its create"]
        for table in ("transitions", "loose_transitions"):  # both hold versions to the key
            (made,) = (
                sql(store)
                .execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,))
                .fetchone()
            )
            assert "CHECK (version BETWEEN 0 AND 16777215)" in made, made
        store.create_many([new_task("loose")])
        assert [t.reason for t in store.history("loose")] == ["appended before its create"]
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
        moved, trail = life_step("other", 2)
        store.write_transitions(moved, expect_version=1, transitions=trail)
        assert [t.version for t in store.history("other")] == [1, 2]
    finally:
        store.close()
    store = SqliteTaskStore(path, create=False)  # rebuilt once: the next open does nothing
    store.close()
    assert len(caplog.records) == 1


def test_the_trail_is_kept_in_the_order_tasks_were_made(tmp_path: Path) -> None:
    """Schema 9: trail rows are keyed by their task's seq first (random task ids put
    each task's rows anywhere in the tree). A trail row of a task the store does not
    hold yet waits in loose_transitions (schema 10) and joins its task when the task is
    made, by every way a task is made; a version the task brings itself is not written
    twice."""
    store = SqliteTaskStore(tmp_path / "seq.db")
    try:
        pk = sorted(
            (row[5], row[1]) for row in sql(store).execute("PRAGMA table_info(transitions)")
        )
        assert [name for order, name in pk if order] == ["key"]  # seq * 16777216 + version
        early = [
            replace(new_task(task_id)[1], reason="early")
            for task_id in ("plain", "viewed", "bulk0")
        ]
        for transition in early:
            store.append(transition)
        store.append(replace(life_step("viewed", 2)[1][0], reason="early"))
        assert [t.reason for t in store.history("viewed")] == ["early", "early"]
        store.create(new_task("plain")[0])
        store.create_many([new_task("viewed")])  # one statement through the write view
        direct = rows_into_the_tables(store)
        store.create_many([new_task(f"bulk{i}") for i in range(70)])  # into the tables
        sql(store).set_trace_callback(None)
        assert direct
        for task_id, versions in [("plain", [1]), ("viewed", [1, 2]), ("bulk0", [1])]:
            history = store.history(task_id)
            assert [t.version for t in history] == versions
            assert {t.reason for t in history} == {"early"}
        rows = sql(store).execute("SELECT key / 16777216, task_id FROM transitions").fetchall()
        assert all(seq > 0 for seq, _ in rows), rows
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
        seqs = dict(sql(store).execute("SELECT task_id, seq FROM tasks"))
        assert sorted(seqs.values()) == list(range(1, 73))
        assert seqs["plain"] < seqs["viewed"] < seqs["bulk0"] < seqs["bulk69"]
        assert all(seqs[task_id] == seq for seq, task_id in rows)
        # Prune takes a task's trail with it; seq is the rowid by name (INTEGER PRIMARY
        # KEY), so a VACUUM after the gap renumbers nothing.
        done = snap("bulk3", status=TaskStatus.SUCCEEDED, status_version=2, attempt=1)
        finish = replace(life_step("bulk3", 2)[1][0], to_status=TaskStatus.SUCCEEDED)
        store.write_transitions(done, expect_version=1, transitions=[finish])
        assert store.prune(keep_terminal=0) == 1
        assert store.history("bulk3") == []
        sql(store).execute("VACUUM")
        assert dict(sql(store).execute("SELECT task_id, seq FROM tasks"))["bulk69"] == 72
        assert [t.version for t in store.history("bulk69")] == [1]
        # A trail row appended after its task was pruned is loose again.
        store.append(new_task("bulk3")[1])
        assert (
            sql(store).execute("SELECT key FROM transitions WHERE task_id = 'bulk3'").fetchall()
            == []
        )
        assert sql(store).execute("SELECT task_id, version FROM loose_transitions").fetchall() == [
            ("bulk3", 1)
        ]
        assert [t.version for t in store.history("bulk3")] == [1]
    finally:
        store.close()


def test_a_version_past_the_trail_key_fails_its_own_write_alone(tmp_path: Path) -> None:
    """The trail keys a row by seq * 16777216 + version: a version past 16777215 is
    refused with a clear error (never skipped, never written into the next task's
    range, never kept loose), and only its own caller's write fails; the rest of its
    batch lands."""
    store = SqliteTaskStore(tmp_path / "cap.db")
    try:
        store.create_many([new_task("a"), new_task("b")])
        a, a_trail = life_step("a", 2)
        b, b_trail = life_step("b", 2)
        far = [replace(t, version=16777216) for t in b_trail]
        results = queued_write_errors(
            store,
            [
                lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
                lambda: store.write_transitions(b, expect_version=1, transitions=far),
            ],
        )
        assert results[0] is None
        assert isinstance(results[1], StoreError) and "16777215" in str(results[1])
        assert store.get("a") == a
        assert store.get("b").status_version == 1  # nothing of the refused write landed
        assert [t.version for t in store.history("b")] == [1]
        with pytest.raises(StoreError):
            store.append(far[0])
        assert [t.version for t in store.history("b")] == [1]
        # Nor does the loose trail take one (it could never join its task).
        with pytest.raises(StoreError):
            store.append(replace(new_task("ghost")[1], version=16777216))
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
    finally:
        store.close()


def test_a_create_after_adopting_a_later_version_keys_its_own_under_its_seq(
    tmp_path: Path,
) -> None:
    """Through the write view a create adopts its task's loose rows, then writes its own
    first transition; an adopted row moves last_insert_rowid() off the task's seq, so the
    trigger looks the seq up: the first transition lands under the task's key, beside
    the adopted one, and the next task's trail is untouched."""
    store = SqliteTaskStore(tmp_path / "adopt.db")
    try:
        store.create_many([new_task("before")])
        store.append(replace(life_step("gap", 2)[1][0], reason="early"))
        store.create_many([new_task("gap")])  # one statement through the write view
        store.create_many([new_task("after")])
        keys = (
            sql(store)
            .execute("SELECT key / 16777216, key % 16777216, task_id FROM transitions ORDER BY key")
            .fetchall()
        )
        assert keys == [(1, 1, "before"), (2, 1, "gap"), (2, 2, "gap"), (3, 1, "after")]
        assert [(t.version, t.reason) for t in store.history("gap")] == [(1, None), (2, "early")]
    finally:
        store.close()


@pytest.mark.parametrize("filler", [0, 70], ids=["one statement", "into the tables"])
def test_a_trail_row_of_a_task_not_held_is_loose_by_every_write(
    tmp_path: Path, filler: int
) -> None:
    """A write may carry another task's transition (a caller hands one over): through
    the write view and straight into the tables alike, a row of a task the store does
    not hold is loose, one of a task it holds goes under that task's seq, and a
    version already there is written neither again nor loose."""
    store = SqliteTaskStore(tmp_path / "loose.db")
    try:
        store.create_many([new_task("held"), *[new_task(f"f{i}") for i in range(filler)]])
        moved, trail = life_step("held", 2)
        elsewhere = [
            replace(new_task("unborn")[1], reason="handed over"),
            replace(new_task("held")[1], reason="again"),  # v1 is there already
        ]
        fillers = [life_step(f"f{i}", 2) for i in range(filler)]
        store.write_transitions_together(
            [(moved, 1, [*elsewhere, *trail]), *[(s, 1, t) for s, t in fillers]]
        )
        assert [(t.version, t.reason) for t in store.history("held")] == [(1, None), (2, "to v2")]
        assert sql(store).execute(
            "SELECT task_id, version, reason FROM loose_transitions"
        ).fetchall() == [("unborn", 1, "handed over")]
        assert [t.reason for t in store.history("unborn")] == ["handed over"]
        store.create_many([new_task("unborn")])  # adopts it: its own v1 is not written
        assert [t.reason for t in store.history("unborn")] == ["handed over"]
        assert sql(store).execute("SELECT COUNT(*) FROM loose_transitions").fetchone() == (0,)
    finally:
        store.close()


@pytest.mark.parametrize("many", [1, 70], ids=["one statement", "into the tables"])
def test_a_create_whose_transition_is_another_tasks_appends_it_there(
    tmp_path: Path, many: int
) -> None:
    """A new task's row carries its own first transition; one handed over for another
    task is appended to that task's trail, as ``append`` would."""
    store = SqliteTaskStore(tmp_path / "c.db")
    store.create_many([new_task("other")])
    made = [new_task(f"t{i}") for i in range(many)]
    _, foreign = new_task("other")
    foreign = replace(foreign, version=2, reason="handed over")
    direct = rows_into_the_tables(store)
    store.create_many([*made, (snap("odd"), foreign)])
    sql(store).set_trace_callback(None)
    assert bool(direct) == (many > 1), direct
    assert [t.reason for t in store.history("other")] == [None, "handed over"]
    assert store.history("odd") == [] and store.get("odd") == snap("odd")
    assert all(store.history(s.task_id) == [t] for s, t in made)
    store.close()


@pytest.mark.parametrize("filler", [0, 70], ids=["one statement", "into the tables"])
def test_a_compare_and_set_carries_its_last_transition_and_the_others_follow(
    tmp_path: Path, filler: int
) -> None:
    """A life row carries the write's last transition (schema 8); the earlier ones are
    trail rows of their own, a write without any leaves the trail alone, and a last one
    of another task is appended there."""
    store = SqliteTaskStore(tmp_path / "l.db")
    store.create_many([new_task(name) for name in ("a", "b", "c", "other")])
    steps = [life_step("a", v)[1][0] for v in (2, 3, 4)]
    moved_a = snap("a", status=TaskStatus.RUNNING, status_version=4, attempt=1)
    saved_b = snap("b", status=TaskStatus.RUNNING, status_version=2)
    foreign = replace(steps[0], task_id="other", reason="handed over")
    moved_c = snap("c", status=TaskStatus.RUNNING, status_version=2)
    calls: list[object] = [
        lambda: store.create_many([new_task(f"f{i}") for i in range(filler)]),
        lambda: store.write_transitions(moved_a, expect_version=1, transitions=steps),
        lambda: store.write_transitions(saved_b, expect_version=1, transitions=()),
        lambda: store.write_transitions(moved_c, expect_version=1, transitions=[foreign]),
    ]
    direct = rows_into_the_tables(store)
    assert queued_write_errors(store, calls) == [None] * 4
    sql(store).set_trace_callback(None)
    assert bool(direct) == bool(filler), direct
    assert store.get("a") == moved_a
    assert [t.reason for t in store.history("a")] == [None, "to v2", "to v3", "to v4"]
    assert store.get("b") == saved_b and [t.version for t in store.history("b")] == [1]
    assert store.get("c") == moved_c and [t.version for t in store.history("c")] == [1]
    assert [t.reason for t in store.history("other")] == [None, "handed over"]
    store.close()


def test_a_schema_15_file_keeps_its_results_last_in_the_row_with_their_previews(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file as the release before the result previews made it: opened, the tasks are
    copied once into the table of schema 16 (the result the row's last column, a long
    one's first characters beside it), every task and its trail kept."""
    from chongming_task.stores.roles import PREVIEW
    from tests.unit.older_files import older_file

    path = tmp_path / "v15.db"
    at = codec.encode_dt(datetime(2026, 1, 1, tzinfo=UTC))
    long = json.dumps(["ü" * 100] * 100)
    values = ["old", "echo", "succeeded", 1, 1, "[]", None, None, None, "n", at]
    values += [at, at, None, None, None, long, None, None, None, 3, None, None, None, None]
    older_file(path, 15, codec.TASK_COLUMNS, values)
    with caplog.at_level("WARNING", logger="chongming_task.store"):
        store = SqliteTaskStore(path, create=False)
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: upgrading to schema {SCHEMA_VERSION}, which copies its 1 tasks once "
            "(about 20 s a million tasks); other processes wait for the file"
        ]
        kept = store.get("old")
        assert kept is not None and kept.outcome == json.loads(long) and kept.priority == 3
        assert [t.reason for t in store.history("old")] == ["made by the older release"]
        found = store.get_previewed("old")
        assert found is not None and found.snapshot == kept.evolve(outcome=None)
        assert found.preview == long[:PREVIEW]
        every = [r[1] for r in sql(store).execute("PRAGMA table_xinfo(tasks)")]
        assert every[-2:] == ["outcome_preview", "outcome"]
    finally:
        store.close()
