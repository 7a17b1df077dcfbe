"""``SqliteTaskStore``: the default store, shared safely by processes on one machine.

One connection per store, opened with ``check_same_thread=False`` and guarded by our own
lock; WAL so readers never block the writer; every write is one ``BEGIN IMMEDIATE ...
COMMIT``, so a read that decides a write (claims, prune) is atomic across processes, and
``save`` is one ``UPDATE ... WHERE status_version = ?``. The runtime's hot writes
(``create_many``, ``write_transitions``) go through a group commit (``_GroupCommit``): the
writes that threads queue while the connection is busy land in one statement. Not for
sharing across machines: network file systems do not give SQLite reliable locks.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ..model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition, utc
from ..states import TERMINAL
from ..values import ValueRules
from . import codec

SCHEMA_VERSION = 1
# The columns a task's life changes (write_transitions writes only these). Identity columns
# (name, tags, bucket, bucket_key, pipeline_run_id, created_at) are fixed at create, and
# leaving them out spares SQLite rewriting three indexes on every write.
_IDENTITY_COLUMNS = (
    "task_id",
    "name",
    "tags",
    "bucket",
    "bucket_key",
    "pipeline_run_id",
    "created_at",
)
_LIFE_COLUMNS_SQL = tuple(c for c in codec.SAVE_COLUMNS if c not in _IDENTITY_COLUMNS)
PAGE_SIZE = 1024  # for new files; see __init__

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id           TEXT PRIMARY KEY,
    name              TEXT NOT NULL,
    status            TEXT NOT NULL,
    status_version    INTEGER NOT NULL,
    attempt           INTEGER NOT NULL,
    tags              TEXT NOT NULL,
    bucket            INTEGER,
    bucket_key        TEXT,
    pipeline_run_id   TEXT,
    owner             TEXT,
    created_at        TEXT NOT NULL,
    started_at        TEXT,
    ended_at          TEXT,
    last_heartbeat_at TEXT,
    progress          TEXT,
    failure           TEXT,
    outcome           TEXT,
    lease_owner       TEXT,
    lease_until       TEXT
);
CREATE INDEX IF NOT EXISTS idx_tasks_status ON tasks (status);
CREATE INDEX IF NOT EXISTS idx_tasks_bucket ON tasks (bucket);
CREATE INDEX IF NOT EXISTS idx_tasks_created_at ON tasks (created_at);
CREATE INDEX IF NOT EXISTS idx_tasks_pipeline ON tasks (pipeline_run_id)
    WHERE pipeline_run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS transitions (
    task_id     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    from_status TEXT,
    to_status   TEXT NOT NULL,
    at          TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT,
    PRIMARY KEY (task_id, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commands (
    command_id  TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    action      TEXT NOT NULL,
    issued_by   TEXT,
    created_at  TEXT NOT NULL,
    reason      TEXT,
    lease_until TEXT,
    finished_at TEXT,
    outcome     TEXT
);
CREATE INDEX IF NOT EXISTS idx_commands_open ON commands (created_at)
    WHERE finished_at IS NULL;
"""

_COLS = ", ".join(codec.TASK_COLUMNS)

# The group commit's single statement. ``task_writes`` is a view nobody reads: inserting a
# row into it runs one of three triggers, so a whole batch of writes (new tasks, each
# task's compare-and-set, trail rows) is one INSERT, one statement, atomic on its own
# (no BEGIN/COMMIT): the sqlite3 module releases the GIL around every statement, and on a
# busy node each release costs a thread switch to get it back. A compare-and-set that
# changes no row raises, which undoes the whole statement.
_TRAIL_VALUES = tuple(c for c in codec.TRANSITION_COLUMNS if c != "task_id")
_WRITE_VIEW_COLUMNS = ("kind", *codec.TASK_COLUMNS, "expect", *_TRAIL_VALUES)
_CONFLICT_MESSAGE = "chongming-task: status_version moved"
_WRITE_VIEW = [
    "CREATE VIEW IF NOT EXISTS task_writes AS SELECT "
    + ", ".join(f"NULL AS {c}" for c in _WRITE_VIEW_COLUMNS)
    + " WHERE 0",
    "CREATE TRIGGER IF NOT EXISTS task_writes_new INSTEAD OF INSERT ON task_writes"
    " WHEN NEW.kind = 'new' BEGIN INSERT INTO tasks ("
    + _COLS
    + ") VALUES ("
    + ", ".join(f"NEW.{c}" for c in codec.TASK_COLUMNS)
    + "); END",
    "CREATE TRIGGER IF NOT EXISTS task_writes_life INSTEAD OF INSERT ON task_writes"
    " WHEN NEW.kind = 'life' BEGIN UPDATE tasks SET "
    + ", ".join(f"{c} = NEW.{c}" for c in _LIFE_COLUMNS_SQL)
    + " WHERE task_id = NEW.task_id AND status_version = NEW.expect;"
    f" SELECT RAISE(ABORT, '{_CONFLICT_MESSAGE}') WHERE changes() = 0; END",
    "CREATE TRIGGER IF NOT EXISTS task_writes_trail INSTEAD OF INSERT ON task_writes"
    " WHEN NEW.kind = 'trail' BEGIN INSERT OR IGNORE INTO transitions ("
    + ", ".join(codec.TRANSITION_COLUMNS)
    + ") VALUES (NEW.task_id, "
    + ", ".join(f"NEW.{c}" for c in _TRAIL_VALUES)
    + "); END",
]
_INSERT_TASK = f"INSERT INTO tasks ({_COLS}) VALUES ({', '.join('?' * len(codec.TASK_COLUMNS))})"
# save = every column but the lease columns (store guide §2.3).
_SAVE_TASK = (
    "UPDATE tasks SET "
    + ", ".join(f"{c} = ?" for c in codec.SAVE_COLUMNS if c != "task_id")
    + " WHERE task_id = ? AND status_version = ?"
)
_SAVE_VALUE_COLUMNS = tuple(c for c in codec.SAVE_COLUMNS if c != "task_id")
_GET_TASK = f"SELECT {_COLS} FROM tasks WHERE task_id = ?"
_TOUCH_TASK = (
    "UPDATE tasks SET progress = COALESCE(?, progress),"
    " last_heartbeat_at = COALESCE(?, last_heartbeat_at),"
    " lease_owner = COALESCE(?, lease_owner), lease_until = COALESCE(?, lease_until)"
    " WHERE task_id = ?"
)
_TR_COLS = ", ".join(codec.TRANSITION_COLUMNS)
_APPEND = (
    f"INSERT OR IGNORE INTO transitions ({_TR_COLS}) "
    f"VALUES ({', '.join('?' * len(codec.TRANSITION_COLUMNS))})"
)
_MARK_LOST = (
    "UPDATE tasks SET status = ?, status_version = ?, ended_at = ?, failure = ?"
    " WHERE task_id = ? AND status_version = ?"
)
_HISTORY = f"SELECT {_TR_COLS} FROM transitions WHERE task_id = ? AND version > ? ORDER BY version"
_CMD_COLS = ", ".join(codec.COMMAND_COLUMNS)
_INSERT_COMMAND = (
    f"INSERT INTO commands ({_CMD_COLS}) VALUES ({', '.join('?' * len(codec.COMMAND_COLUMNS))})"
)
_CLAIMABLE = (
    f"SELECT {_CMD_COLS} FROM commands WHERE finished_at IS NULL"
    " AND (lease_until IS NULL OR lease_until <= ?) ORDER BY created_at, rowid LIMIT ?"
)
_LEASE_COMMAND = "UPDATE commands SET lease_until = ? WHERE command_id = ?"
_COMPLETE_COMMAND = (
    "UPDATE commands SET finished_at = ?, outcome = ?, lease_until = NULL WHERE command_id = ?"
)
_RELEASE_COMMAND = (
    "UPDATE commands SET lease_until = NULL WHERE command_id = ? AND finished_at IS NULL"
)
_TERMINAL_VALUES = tuple(sorted(s.value for s in TERMINAL))
_TERMINAL_IN = ", ".join("?" * len(_TERMINAL_VALUES))
_PRUNABLE = (
    f"SELECT task_id FROM tasks WHERE status IN ({_TERMINAL_IN})"
    " ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?"
)


class SqliteTaskStore:
    """A ``TaskStore`` in one SQLite file (or ``":memory:"``).

    ``create=False`` refuses to create a missing file: read-only tools should say "no
    such database" rather than silently show an empty one.
    """

    def __init__(
        self, path: str | Path = "chongming-task.db", *, create: bool = True, timeout: float = 30.0
    ) -> None:
        self.path = str(path)
        self._lock = threading.RLock()  # re-entrant: methods run inside atomic()
        self._depth = 0  # > 0 while a write scope (or atomic()) holds the transaction
        self._holder: int | None = None  # the thread whose write scope holds it
        self._group = _GroupCommit(self)
        self._closed = False
        memory = self.path == ":memory:"
        if not memory and not create and not Path(self.path).exists():
            raise StoreError(f"no database at {self.path}")
        try:
            self._conn = sqlite3.connect(
                self.path,
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
                # Room for the group commit's batched statements (one per row count).
                cached_statements=512,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite database {self.path}: {exc}") from exc
        try:
            with self._guard("open"):
                self._open(memory=memory, create=create, timeout=timeout)
        except StoreError:
            self._conn.close()
            self._closed = True
            raise

    def _open(self, *, memory: bool, create: bool, timeout: float) -> None:
        """Configure the connection; create or upgrade the schema only when it is not
        current. Opening a current file writes nothing and takes no lock, so a reader
        (``ps``, ``show``) opens and reads under WAL while another process holds the write
        lock, and never rewrites the header of a file it only reads."""
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        # Per connection, nothing written: NORMAL in WAL mode survives process crashes
        # (only an OS crash or power loss may drop the last commits); task rows are
        # rewritten several times in their first second, so checkpoint less often and a
        # hot page is copied back once, not once per transition.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint = 8192")
        conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
        if self._schema_is_current():
            return
        if not create and not memory and not self._has_tables():
            raise StoreError(
                f"{self.path} is not a chongming-task database (it has no tasks table"
                f"{'; the file is empty' if Path(self.path).stat().st_size == 0 else ''}): "
                "check --db, or create it with `chongming-task --db PATH migrate`"
            )
        # A new file gets small pages: every commit copies each page it dirtied into the
        # WAL, and a task's write dirties a few pages (its row, the status index, its
        # trail) to change a few hundred bytes. No effect on an existing file.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        if not memory:
            conn.execute("PRAGMA journal_mode = WAL")
        self._migrate()

    def _schema_is_current(self) -> bool:
        """Whether the schema is this version's, to the last object (a read, no lock)."""
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this "
                f"chongming-task understands ({SCHEMA_VERSION}); upgrade chongming-task"
            )
        if version < SCHEMA_VERSION:
            return False
        (found,) = self._conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'task_writes_trail'"
        ).fetchone()
        mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        return bool(found) and (self.path == ":memory:" or mode == "wal")

    def _has_tables(self) -> bool:
        (found,) = self._conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'tasks'"
        ).fetchone()
        return bool(found)

    value_rules = ValueRules(nul_in_text=True)
    """SQLite keeps any UTF-8 text, NUL included (see ``chongming_task.values``)."""

    def __repr__(self) -> str:
        return f"SqliteTaskStore({self.path!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _translate(self, exc: sqlite3.DatabaseError, what: str) -> StoreError:
        """sqlite3's error as a ``StoreError`` naming the file."""
        message = str(exc)
        if "file is not a database" in message or "malformed" in message:
            return StoreError(f"{self.path} is not a usable SQLite database ({message})")
        return StoreError(f"SQLite {what} failed on {self.path}: {message}")

    def _not_text(self, exc: UnicodeEncodeError, what: str) -> StoreError:
        bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else "?"
        return StoreError(
            f"SQLite {what} on {self.path}: a value is not valid UTF-8 text ({bad!r}); "
            "nothing was written"
        )

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc, what) from exc

    def _locked(self, what: str) -> _ReadScope:
        """``with self._locked(what) as conn``: the connection, under our lock."""
        return _ReadScope(self, what)

    def _write(self, what: str) -> _WriteScope:
        """Run a write (or a read that decides a write) atomically and durably: one
        ``BEGIN IMMEDIATE ... COMMIT`` under our lock, so a read that decides a write
        (claims, prune) is atomic against other processes too. Inside ``atomic()`` a
        write joins the caller's transaction.
        """
        return _WriteScope(self, what)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Optional capability (not part of ``TaskStore``): the calls made inside commit
        together or not at all. The write-through uses it to land a ``save`` and its
        ``append`` calls in one transaction."""
        with self._write("atomic"):
            yield

    def _migrate(self) -> None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this "
                    f"chongming-task understands ({SCHEMA_VERSION}); upgrade chongming-task"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            for statement in _WRITE_VIEW:  # triggers hold ";": not in _SCHEMA's split
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _snapshot(row: Sequence[Any]) -> TaskSnapshot:
        return codec.values_to_snapshot(row)

    # -- task snapshots -------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        values = codec.snapshot_to_values(snapshot)  # encoded before the lock is taken
        try:
            with self._write("create") as conn:
                conn.execute(_INSERT_TASK, values)
        except StoreError as exc:
            if isinstance(exc.__cause__, sqlite3.IntegrityError):
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists") from exc
            raise

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = codec.snapshot_to_row(snapshot)
        params = [row[c] for c in _SAVE_VALUE_COLUMNS]
        params += [snapshot.task_id, expect_version]
        with self._write("save") as conn:
            updated = conn.execute(_SAVE_TASK, params).rowcount
            found = (
                None
                if updated == 1
                else conn.execute(
                    "SELECT status_version FROM tasks WHERE task_id = ?", (snapshot.task_id,)
                ).fetchone()
            )
        if updated == 1:
            return
        raise ConcurrencyConflict.version_mismatch(
            snapshot.task_id, expect_version, None if found is None else found[0]
        )

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._locked("get") as conn:
            row = conn.execute(_GET_TASK, (task_id,)).fetchone()
        return None if row is None else self._snapshot(row)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        sql, params = _query_sql(query or TaskQuery())
        with self._locked("query") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._snapshot(r) for r in rows]

    def explain_query(self, query: TaskQuery | None = None) -> list[str]:
        """SQLite's plan for ``query(query)``: proof that a filter uses its index."""
        sql, params = _query_sql(query or TaskQuery())
        with self._locked("explain") as conn:
            return [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

    def counts(self) -> dict[TaskStatus, int]:
        with self._locked("counts") as conn:
            rows = conn.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status").fetchall()
        return {TaskStatus(status): n for status, n in rows}

    # -- audit trail ------------------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        values = codec.transition_to_values(transition)  # encoded before the lock is taken
        with self._write("append") as conn:
            conn.execute(_APPEND, values)

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._locked("history") as conn:
            rows = conn.execute(_HISTORY, (task_id, since_version)).fetchall()
        return [codec.values_to_transition(r) for r in rows]

    # -- side channel -----------------------------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        params = codec.touch_values(task_id, progress, heartbeat_at, lease_owner, lease_until)
        if params is None:
            return
        with self._write("touch") as conn:
            conn.execute(_TOUCH_TASK, params)

    # -- commands ---------------------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        values = codec.command_to_values(command)  # encoded before the lock is taken
        with self._write("submit_command") as conn:
            conn.execute(_INSERT_COMMAND, values)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        now = utc(now, "now")
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        with self._write("claim_commands") as conn:
            rows = conn.execute(_CLAIMABLE, (codec.encode_dt(now), limit)).fetchall()
            conn.executemany(_LEASE_COMMAND, [(until, r[0]) for r in rows])
        claimed = []
        for r in rows:
            row = dict(zip(codec.COMMAND_COLUMNS, r, strict=True))
            row["lease_until"] = until
            claimed.append(codec.row_to_command(row))
        return claimed

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._write("complete_command") as conn:
            conn.execute(_COMPLETE_COMMAND, (codec.encode_dt(now), outcome, command_id))

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._write("release_command") as conn:
            conn.execute(_RELEASE_COMMAND, (command_id,))

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """Optional capability (not part of ``TaskStore``), used by ``submit``,
        ``submit_many`` and ``submit_pipeline``: ``create`` every snapshot and ``append`` its
        transition in one transaction, all rows encoded before the connection lock is
        taken. All or nothing; an existing id raises ``TaskAlreadyExists``.

        Committed by group commit (``_GroupCommit``): it returns once the rows are
        committed, possibly in one transaction with other threads' writes."""
        rows = [["new", *codec.snapshot_to_values(s), *_NEW_PAD] for s, _ in items]
        rows += [_trail_row(t) for _, t in items]
        self._group_write(_WriteRequest(rows, creates=len(items)))

    def write_transitions(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition],
    ) -> None:
        """Optional capability (not part of ``TaskStore``), used by the write-through:
        compare-and-set the columns a task's life changes (``_LIFE_COLUMNS``; the identity
        columns are fixed at create) and ``append`` the transitions, in one transaction,
        every row encoded before the connection lock is taken. Raises
        ``ConcurrencyConflict`` like ``save``, with nothing written.

        Committed by group commit (``_GroupCommit``)."""
        life: list[Any] = [None] * len(_WRITE_VIEW_COLUMNS)
        life[0] = "life"
        life[1] = snapshot.task_id
        life[_AT["status"]] = snapshot.status.value
        life[_AT["status_version"]] = snapshot.status_version
        life[_AT["attempt"]] = snapshot.attempt
        life[_AT["owner"]] = snapshot.owner
        life[_AT["started_at"]] = codec.encode_dt(snapshot.started_at)
        life[_AT["ended_at"]] = codec.encode_dt(snapshot.ended_at)
        life[_AT["last_heartbeat_at"]] = codec.encode_dt(snapshot.last_heartbeat_at)
        life[_AT["progress"]] = codec.encode_progress(snapshot.progress)
        life[_AT["failure"]] = codec.encode_failure(snapshot.failure)
        life[_AT["outcome"]] = codec.encode_json(snapshot.outcome)
        life[_AT["expect"]] = expect_version
        rows = [life, *map(_trail_row, transitions)]
        self._group_write(_WriteRequest(rows, expect=(snapshot.task_id, expect_version)))

    def _group_write(self, request: _WriteRequest) -> None:
        """Commit ``request``: on this thread if it already holds the transaction (inside
        ``atomic()``), else through the group-commit writer.

        Every value is checked before the request joins a batch: a batch is one
        statement, and a value SQLite cannot bind would fail every caller in it, not
        just the one who handed it over."""
        _check_text_values(self, request.rows)
        if self._holder == threading.get_ident():
            with self._write("write") as conn:
                request.apply_alone(conn)
            return
        self._group.run(request)

    def mark_lost(self, marks: Sequence[tuple[TaskSnapshot, Transition]]) -> set[str]:
        """Optional capability (not part of ``TaskStore``), used by ``reconcile()``.

        For each ``(lost snapshot, its transition)``: compare-and-set ``status``,
        ``status_version``, ``ended_at`` and ``failure`` where the stored version is still
        ``transition.version - 1``, and append the transition only where that won. One
        transaction. Returns the ids marked; the others moved on (their holder is alive).
        """
        if not marks:
            return set()
        # Reconcile marks many tasks with the same time and failure: encode each once.
        times: dict[datetime | None, str | None] = {}
        failures: dict[int, str | None] = {}

        def dt(value: datetime | None) -> str | None:
            if value not in times:
                times[value] = codec.encode_dt(value)
            return times[value]

        def failure(m: TaskSnapshot) -> str | None:
            key = id(m.failure)
            if key not in failures:
                failures[key] = codec.encode_failure(m.failure)
            return failures[key]

        params = [
            (m.status.value, m.status_version, dt(m.ended_at), failure(m), m.task_id, t.version - 1)
            for m, t in marks
        ]
        wanted = {m.task_id: m.status_version for m, _ in marks}
        with self._write("mark_lost") as conn:
            changed = conn.executemany(_MARK_LOST, params).rowcount
            if changed == len(marks):
                won = set(wanted)
            else:  # someone moved: read back which rows carry our version and status
                won = set()
                ids = list(wanted)
                for offset in range(0, len(ids), 500):
                    part = ids[offset : offset + 500]
                    rows = conn.execute(
                        f"SELECT task_id, status, status_version FROM tasks WHERE task_id IN "
                        f"({', '.join('?' * len(part))})",
                        part,
                    ).fetchall()
                    won.update(
                        task_id
                        for task_id, status, version in rows
                        if status == TaskStatus.LOST.value and version == wanted[task_id]
                    )
            conn.executemany(
                _APPEND,
                (
                    (
                        t.task_id,
                        t.version,
                        t.from_status.value if t.from_status else None,
                        t.to_status.value,
                        dt(t.at),
                        t.reason,
                        t.actor,
                    )
                    for m, t in marks
                    if m.task_id in won
                ),
            )
        return won

    # -- operations -------------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        if keep_terminal < 0:
            raise ValueError(f"keep_terminal must be >= 0, got {keep_terminal}")
        with self._write("prune") as conn:
            doomed = [(r[0],) for r in conn.execute(_PRUNABLE, (*_TERMINAL_VALUES, keep_terminal))]
            conn.executemany("DELETE FROM transitions WHERE task_id = ?", doomed)
            conn.executemany(
                "DELETE FROM commands WHERE task_id = ? AND finished_at IS NOT NULL", doomed
            )
            conn.executemany("DELETE FROM tasks WHERE task_id = ?", doomed)
        return len(doomed)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()


def _query_sql(query: TaskQuery) -> tuple[str, list[Any]]:
    """The SELECT for a ``TaskQuery``: fixed fragments, values always bound as parameters."""
    where: list[str] = []
    params: list[Any] = []
    if query.statuses is not None:
        where.append(f"status IN ({', '.join('?' * len(query.statuses))})")
        params.extend(sorted(s.value for s in query.statuses))
    if query.name is not None:
        where.append("name = ?")
        params.append(query.name)
    if query.name_prefix is not None:
        where.append("substr(name, 1, ?) = ?")
        params.extend((len(query.name_prefix), query.name_prefix))
    if query.tag is not None:
        # Exact element match on the tags' JSON text: ",<encoded tag>," within the array
        # with its brackets turned into commas. Inside a JSON string every quote is
        # escaped, so '"' after a ',' only starts an element. (json_each cuts a string at
        # an escaped NUL, so it could not match a tag holding one.)
        where.append("instr(',' || substr(tags, 2, length(tags) - 2) || ',', ?) > 0")
        params.append("," + codec.encode_tags([query.tag])[1:-1] + ",")
    if query.buckets is not None:
        where.append(f"bucket IN ({', '.join('?' * len(query.buckets))})")
        params.extend(sorted(query.buckets))
    if query.pipeline_run_id is not None:
        where.append("pipeline_run_id = ?")
        params.append(query.pipeline_run_id)
    sql = f"SELECT {_COLS} FROM tasks"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += (
        " ORDER BY created_at DESC, rowid DESC"
        if query.newest_first
        else (" ORDER BY created_at, rowid")
    )
    if query.limit is not None:
        sql += " LIMIT ?"
        params.append(query.limit)
    return sql, params


class _ReadScope:
    """Lock, closed check and error translation, as a plain class: these run on every
    store call, where generator-based context managers cost more than the SQL."""

    __slots__ = ("_store", "_what")

    def __init__(self, store: SqliteTaskStore, what: str) -> None:
        self._store = store
        self._what = what

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        if store._closed:
            store._lock.release()
            raise StoreError(f"SqliteTaskStore({store.path}) is closed")
        return store._conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        store._lock.release()
        if store._group._queue:
            store._group.serve()  # writes queued while we held the lock
        if isinstance(exc, sqlite3.DatabaseError):
            raise store._translate(exc, self._what) from exc
        if isinstance(exc, UnicodeEncodeError):
            raise store._not_text(exc, self._what) from exc


class _WriteScope:
    """See ``SqliteTaskStore._write``."""

    __slots__ = ("_nested", "_store", "_what")

    def __init__(self, store: SqliteTaskStore, what: str) -> None:
        self._store = store
        self._what = what
        self._nested = False

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            if store._closed:
                raise StoreError(f"SqliteTaskStore({store.path}) is closed")
            if store._depth:  # inside atomic(): part of the caller's transaction
                store._depth += 1
                self._nested = True
                return store._conn
            store._conn.execute("BEGIN IMMEDIATE")
            store._depth = 1
            store._holder = threading.get_ident()
            return store._conn
        except sqlite3.DatabaseError as exc:
            store._lock.release()
            raise store._translate(exc, self._what) from exc
        except BaseException:
            store._lock.release()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        if self._nested:
            store._depth -= 1
            store._lock.release()
            if isinstance(exc, sqlite3.DatabaseError):
                raise store._translate(exc, self._what) from exc
            if isinstance(exc, UnicodeEncodeError):
                raise store._not_text(exc, self._what) from exc
            return
        try:
            store._depth = 0
            store._holder = None
            if exc is None:
                store._conn.execute("COMMIT")
            else:
                store._conn.execute("ROLLBACK")
        except sqlite3.DatabaseError as end_error:
            if store._conn.in_transaction:
                store._conn.execute("ROLLBACK")
            raise store._translate(end_error, "commit") from end_error
        finally:
            store._lock.release()
            if store._group._queue:
                store._group.serve()  # writes queued while we held the lock
        if isinstance(exc, sqlite3.DatabaseError):
            raise store._translate(exc, self._what) from exc
        if isinstance(exc, UnicodeEncodeError):
            raise store._not_text(exc, self._what) from exc


def _check_text_values(store: SqliteTaskStore, rows: list[list[Any]]) -> None:
    """Raise ``StoreError`` (this caller's alone) if a text value is not UTF-8."""
    for row in rows:
        for value in row:
            if type(value) is str and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise store._not_text(exc, f"write of task {row[1]}") from None


_AT = {c: i for i, c in enumerate(_WRITE_VIEW_COLUMNS)}
_WIDTH = len(_WRITE_VIEW_COLUMNS)
_ROWS_PER_STATEMENT = 64  # 64 x 27 parameters, well under SQLite's limit (32766)


_NEW_PAD = [None] * (1 + len(_TRAIL_VALUES))  # expect, trail columns


_TRAIL_PAD = [None] * (len(codec.TASK_COLUMNS) - 1 + 1)  # task columns after task_id, expect


def _trail_row(t: Transition) -> list[Any]:
    task_id, *trail = codec.transition_to_values(t)
    return ["trail", task_id, *_TRAIL_PAD, *trail]


_ONE_ROW = "(" + ", ".join("?" * _WIDTH) + ")"
_WRITE_HEAD = f"INSERT INTO task_writes ({', '.join(_WRITE_VIEW_COLUMNS)}) VALUES "


# The statement for each row count, built once: the same string object each time keeps
# the sqlite3 statement-cache lookup to a cached hash.
_WRITE_SQL = ["", *(_WRITE_HEAD + ", ".join([_ONE_ROW] * n) for n in range(1, 65))]


def _write_rows(conn: sqlite3.Connection, rows: list[list[Any]]) -> None:
    """Insert ``rows`` into the write view: one statement (per 64 rows)."""
    for offset in range(0, len(rows), _ROWS_PER_STATEMENT):
        part = rows[offset : offset + _ROWS_PER_STATEMENT]
        conn.execute(_WRITE_SQL[len(part)], [v for row in part for v in row])


class _WriteRequest:
    """One caller's write, as rows of the write view: new tasks with their trail
    (``create_many``), or one task's compare-and-set with its trail
    (``write_transitions``)."""

    __slots__ = ("creates", "done", "error", "expect", "rows")

    def __init__(
        self,
        rows: list[list[Any]],
        *,
        creates: int = 0,
        expect: tuple[str, int] | None = None,
    ) -> None:
        self.rows = rows
        self.creates = creates
        self.expect = expect
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()  # released once the request is committed or has failed

    def apply_alone(self, conn: sqlite3.Connection) -> None:
        """This request by itself, all or nothing, in a savepoint of the caller's
        transaction; on a conflict or an existing id it raises with nothing written."""
        conn.execute("SAVEPOINT request")
        try:
            self._insert(conn)
        except BaseException:
            conn.execute("ROLLBACK TO request")
            raise
        finally:
            conn.execute("RELEASE request")

    def _insert(self, conn: sqlite3.Connection) -> None:
        try:
            _write_rows(conn, self.rows)
        except sqlite3.IntegrityError as exc:
            if self.expect is not None and _CONFLICT_MESSAGE in str(exc):
                task_id, expected = self.expect
                found = conn.execute(
                    "SELECT status_version FROM tasks WHERE task_id = ?", (task_id,)
                ).fetchone()
                raise ConcurrencyConflict.version_mismatch(
                    task_id, expected, None if found is None else found[0]
                ) from None
            if self.creates:
                raise TaskAlreadyExists(f"a task id among {self.creates} already exists") from None
            raise


_MAX_BATCH = 256


class _GroupCommit:
    """Group commit for the write-through and submit paths, by flat combining: a thread
    that finds the connection free commits its own write and every write queued by other
    threads as one INSERT into the ``task_writes`` view (one statement per 64 rows; a
    single statement is its own transaction). A thread that finds the connection busy
    queues its write and sleeps until a combiner has committed it. Every call is still
    durable when it returns; an uncontended write runs on its own thread, no hand-off.

    Why: with one connection taken by lock, worker threads queued behind whoever held it
    across a GIL switch; every statement released the GIL that its thread then had to win
    back; and every commit rewrote the same hot pages (a task row's leaf, the status
    index, the trail) in the WAL. Here a waiter never takes the lock again after waking,
    a batch costs one statement, and it writes shared pages once. (A dedicated writer
    thread was measured too: two thread hand-offs per write cost ~90 us on the reference
    VM.)

    If the statement fails on a constraint (a compare-and-set found another version, or
    a new id exists), nothing of the batch was written: it is redone request by request
    in one transaction, each in a savepoint, so the failing requests raise on their own
    and the others land. Any other error fails every request in the batch, with nothing
    written.
    """

    # Safety net only: every release of the store's lock serves the queue, so a queued
    # write is never left without a thread to commit it.
    _RETRY = 0.05

    def __init__(self, store: SqliteTaskStore) -> None:
        self._store = store
        self._queue: deque[_WriteRequest] = deque()  # append / popleft: atomic
        self._server: int | None = None  # the thread committing a batch, under the lock

    def run(self, request: _WriteRequest) -> None:
        # Queue first, then try the lock: if the try fails, the holder has not released
        # yet, and it looks at the queue after releasing (see serve()).
        self._queue.append(request)
        self.serve()
        while not request.done.acquire(timeout=self._RETRY):
            self.serve()
        if request.error is not None:
            raise request.error

    def serve(self) -> None:
        """Commit queued writes, a batch at a time, while there are some and the store's
        lock is free. Called by writers and after every release of the lock."""
        store = self._store
        lock = store._lock
        queue_ = self._queue
        me = threading.get_ident()
        if self._server == me:
            return  # the scopes of our own commit end here: the loop below continues
        while queue_ and lock.acquire(blocking=False):
            try:
                if store._depth:
                    return  # this thread is inside atomic(): never commit others' writes there
                self._server = me
                batch: list[_WriteRequest] = []
                while queue_ and len(batch) < _MAX_BATCH:
                    batch.append(queue_.popleft())
                if batch:
                    self._commit(batch)
            finally:
                self._server = None
                lock.release()

    def _commit(self, batch: list[_WriteRequest]) -> None:
        """Called holding the store's lock."""
        store = self._store
        rows = [row for request in batch for row in request.rows]
        try:
            if len(rows) <= _ROWS_PER_STATEMENT:
                try:  # the common case: one statement, its own transaction
                    with store._locked("group commit") as conn:
                        _write_rows(conn, rows)
                except StoreError as exc:
                    if not isinstance(exc.__cause__, sqlite3.IntegrityError):
                        raise
                    self._one_by_one(batch)  # nothing was written: find who failed
            else:
                try:
                    with store._write("group commit") as conn:
                        _write_rows(conn, rows)
                except StoreError as exc:
                    if not isinstance(exc.__cause__, sqlite3.IntegrityError):
                        raise
                    self._one_by_one(batch)
        except BaseException as exc:  # the transaction failed: none of the batch landed
            for request in batch:
                if request.error is None:
                    # One exception per caller: each raises it on its own thread.
                    request.error = StoreError(str(exc) or type(exc).__name__)
                    request.error.__cause__ = exc
            if not isinstance(exc, Exception):  # KeyboardInterrupt & co: after the waiters
                for request in batch:
                    request.done.release()
                raise
        for request in batch:
            request.done.release()

    def _one_by_one(self, batch: list[_WriteRequest]) -> None:
        """A conflict or an existing id somewhere in the batch undid it all: redo it in one
        transaction, each request in a savepoint, so only the failing ones fail."""
        with self._store._write("group commit") as conn:
            for request in batch:
                try:
                    request.apply_alone(conn)
                except (ConcurrencyConflict, TaskAlreadyExists) as exc:
                    request.error = exc  # its own failure: nothing of it written
