"""``SqliteTaskStore``: the default store, shared safely by processes on one machine.

One connection per store, opened with ``check_same_thread=False`` and guarded by our own
lock; WAL so readers never block the writer; every write is one ``BEGIN IMMEDIATE ...
COMMIT``, so a read that decides a write (claims, prune) is atomic across processes, and
``save`` is one ``UPDATE ... WHERE status_version = ?``. The runtime's hot writes
(``create_many``, ``write_transitions``) go through a group commit (``GroupCommit``): the
writes that threads queue while the connection is busy land together (a small batch in
one statement), and a thread of the store's own copies the WAL back into the file
(``Checkpointer``), never a committing caller. Not for sharing across machines: network
file systems do not give SQLite reliable locks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ...errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ...model import (
    Command,
    Progress,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
    utc,
)
from ...values import ValueRules
from .. import codec
from .._nodes import NodeRegistrySQL, PipelineRegistrySQL, ScheduleRegistrySQL
from .._sql import (
    Dialect,
    TaskScanSQL,
    encoded_tag,
    load_named,
    newer_schema,
    query_sql,
    verdicts_of_expired,
)
from .._supports import LifeWrite
from ..capabilities import Verdict
from .checkpoint import Checkpointer
from .group import Behind, GroupCommit, Row, WriteRequest, adopt_loose, append_rows
from .scopes import ReadScope, WriteScope

__all__ = ["PAGE_SIZE", "SCHEMA_VERSION", "SqliteTaskStore"]

SCHEMA_VERSION = 11  # 2: nodes, node_buckets; 3: schedules; 4: pipelines; 5: finished
# index; 6: owner index, owner fixed at create; 7: a new task's row carries its first
# transition (task_writes_new); 8: a compare-and-set's row carries its last one
# (task_writes_life); 9: tasks.seq, the trail keyed by it (_rebuild_trail); 10: the
# trail of tasks not held in loose_transitions; 11: the trail keyed by rowid, seq * 2^24 +
# version (_rebuild_trail)
PAGE_SIZE = 1024  # for new files; see _open

log = logging.getLogger("chongming_task.store")

_SQL = load_named(__package__)
_SCHEMA = [sql for name, sql in _SQL.items() if name.startswith("schema_")]
# save writes every column but the lease (store guide §2.3), in queries.sql's order.
_SAVE_VALUE_COLUMNS = tuple(c for c in codec.SAVE_COLUMNS if c != "task_id")
_SELECT_TASKS = "SELECT " + ", ".join(codec.TASK_COLUMNS) + " FROM tasks"
_DIALECT = Dialect(
    select=_SELECT_TASKS,
    placeholder="?",
    unindexed=lambda column: f"+{column}",
    one_of=lambda column, values: (f"{column} IN ({', '.join('?' * len(values))})", values),
    prefix=lambda column, text: (f"substr({column}, 1, ?) = ?", [len(text), text]),
    # Exact element match on the tags' JSON text: ",<encoded tag>," within the array with
    # its brackets turned into commas. Inside a JSON string every quote is escaped, so
    # '"' after a ',' only starts an element. (json_each cuts a string at an escaped
    # NUL, so it could not match a tag holding one.)
    tag=lambda tag: (
        "instr(',' || substr(tags, 2, length(tags) - 2) || ',', ?) > 0",
        ["," + encoded_tag(tag) + ","],
    ),
    insertion_order="seq",
    time="?",
    trail_of_task=(
        "tr.key = tasks.seq * 16777216 + tasks.status_version AND tr.task_id = tasks.task_id"
    ),
)


class SqliteTaskStore(NodeRegistrySQL, ScheduleRegistrySQL, PipelineRegistrySQL, TaskScanSQL):
    """A ``TaskStore`` in one SQLite file (or ``":memory:"``).

    ``create=False`` refuses to create a missing file: read-only tools should say "no
    such database" rather than silently show an empty one.
    """

    def __init__(
        self,
        path: str | Path = "chongming-task.db",
        *,
        create: bool = True,
        timeout: float = 30.0,
        upgrade: bool = True,
    ) -> None:
        """``create=False`` refuses a file that does not exist or holds no tasks table;
        ``upgrade=False`` refuses a file of an older schema instead of upgrading it (the
        CLI's commands other than ``migrate`` and ``run``: an upgraded file is one the
        running nodes of an older release can no longer use, and some upgrades rebuild
        the trail while every other process waits)."""
        self.path = str(path)
        self._lock = threading.RLock()  # re-entrant: methods run inside atomic()
        self._depth = 0  # > 0 while a write scope (or atomic()) holds the transaction
        self._holder: int | None = None  # the thread whose write scope holds it
        memory = self.path == ":memory:"
        # A file's WAL is copied back by a thread of its own, never by a committing caller.
        self._checkpointer = None if memory else _checkpointer_of(self)
        self._committed = _nothing if self._checkpointer is None else self._checkpointer.committed
        self._group = GroupCommit(
            lock=self._lock,
            in_transaction=lambda: self._depth > 0,
            statement=self._locked,
            transaction=self._write,
            not_text=self._not_text,
            committed=self._committed,
        )
        self._closed = False
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
                self._open(memory=memory, create=create, timeout=timeout, upgrade=upgrade)
        except StoreError:
            self._conn.close()
            self._closed = True
            raise

    def _open(self, *, memory: bool, create: bool, timeout: float, upgrade: bool) -> None:
        """Configure the connection; create or upgrade the schema only when it is not
        current. Opening a current file writes nothing and takes no lock, so a reader
        (``ps``, ``show``) opens and reads under WAL while another process holds the write
        lock, and never rewrites the header of a file it only reads."""
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        # Per connection, nothing written: NORMAL in WAL mode survives process crashes
        # (only an OS crash or power loss may drop the last commits).
        conn.execute("PRAGMA synchronous = NORMAL")
        # No automatic checkpoints: the Checkpointer's thread makes them (a commit that
        # took the WAL past the threshold made its caller wait for ~8,000 pages copied).
        conn.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT if memory else 0}")
        conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
        if self._schema_is_current():
            return
        if not create and not memory and not self._has_tables():
            raise StoreError(
                f"{self.path} is not a chongming-task database (it has no tasks table"
                f"{'; the file is empty' if Path(self.path).stat().st_size == 0 else ''}): "
                "check --db, or create it with `chongming-task --db PATH migrate`"
            )
        if not upgrade and not memory and self._has_tables():
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            raise StoreError(
                f"{self.path} has schema {version}, older than this chongming-task's "
                f"({SCHEMA_VERSION}); it is not upgraded here, as nodes of the older release "
                "could not use it after: upgrade the nodes, or stop them and run "
                f"`chongming-task --db {self.path} migrate`"
            )
        # A new file gets small pages: every commit copies each page it dirtied into the
        # WAL, and a task's write dirties a few pages (its row, the status index, its
        # trail) to change a few hundred bytes. No effect on an existing file.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        if not memory:
            self._use_wal(timeout)
        self._migrate()

    def _use_wal(self, timeout: float) -> None:
        """Switch the file to WAL, trying again for up to ``timeout`` while another
        process holds it. Nodes started together on a new file each switch it, and
        while one's switch (or any write in the rollback journal) holds the write lock,
        SQLite answers the others "database is locked" at once, without the busy
        handler: a switch holds a read lock, and waiting on a writer with it could
        deadlock. So an open failed where ``timeout`` promised a wait."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                (mode,) = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        if mode != "wal":
            raise StoreError(
                f"SQLite kept {self.path} in journal mode {mode!r}: this store needs WAL "
                "(readers beside a writer); WAL needs the processes to share memory, which "
                "a network file system cannot give"
            )

    def _schema_is_current(self) -> bool:
        """Whether the schema is this version's, to the last object (a read, no lock)."""
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise newer_schema(str(self.path), version, SCHEMA_VERSION)
        if version < SCHEMA_VERSION:
            return False
        (found,) = self._conn.execute(
            "SELECT COUNT(*) FROM sqlite_master "
            "WHERE name IN ('task_writes_trail', 'node_buckets', 'schedules', 'pipelines', "
            "'idx_commands_finished', 'idx_tasks_owner', 'loose_transitions')"
        ).fetchone()
        mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        return found == 7 and (self.path == ":memory:" or mode == "wal")

    def _has_tables(self) -> bool:
        (found,) = self._conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'tasks'"
        ).fetchone()
        return bool(found)

    group_commit = True
    """Writes made side by side share a statement (``GroupCommit``)."""

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

    _sql = _SQL
    _dialect = _DIALECT

    def _sql_scope(self, what: str, *, write: bool) -> ReadScope | WriteScope:
        return self._write(what) if write else self._locked(what)

    def _locked(self, what: str) -> ReadScope:
        """``with self._locked(what) as conn``: the connection, under our lock."""
        return ReadScope(self, what)

    def _write(self, what: str) -> WriteScope:
        """Run a write (or a read that decides a write) atomically and durably: one
        ``BEGIN IMMEDIATE ... COMMIT`` under our lock, so a read that decides a write
        (claims, prune) is atomic against other processes too. Inside ``atomic()`` a
        write joins the caller's transaction.
        """
        return WriteScope(self, what)

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
                raise newer_schema(str(self.path), version, SCHEMA_VERSION)
            trail = _columns(conn, "transitions")
            if trail and trail[0] != "key":  # a file made before schema 11
                (tasks,) = conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
                log.warning(
                    "%s: upgrading to schema %d, which rebuilds the trail of its %d tasks "
                    "once (about 40 s a million tasks); other processes wait for the file",
                    self.path,
                    SCHEMA_VERSION,
                    tasks,
                )
                _rebuild_trail(conn)
            for statement in _SCHEMA:
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
                conn.execute(_SQL["insert_task"], values)
                adopt_loose(conn)
        except StoreError as exc:
            if isinstance(exc.__cause__, sqlite3.IntegrityError):
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists") from exc
            raise

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = codec.snapshot_to_row(snapshot)
        params = [row[c] for c in _SAVE_VALUE_COLUMNS]
        params += [snapshot.task_id, expect_version]
        with self._write("save") as conn:
            updated = conn.execute(_SQL["save_task"], params).rowcount
            found = (
                None
                if updated == 1
                else conn.execute(_SQL["stored_version"], (snapshot.task_id,)).fetchone()
            )
        if updated == 1:
            return
        raise ConcurrencyConflict.version_mismatch(
            snapshot.task_id, expect_version, None if found is None else found[0]
        )

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._locked("get") as conn:
            row = conn.execute(_SQL["get_task"], (task_id,)).fetchone()
        return None if row is None else self._snapshot(row)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        sql, params = query_sql(query or TaskQuery(), _DIALECT)
        with self._locked("query") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._snapshot(r) for r in rows]

    def explain_query(self, query: TaskQuery | None = None) -> list[str]:
        """SQLite's plan for ``query(query)``: proof that a filter uses its index."""
        sql, params = query_sql(query or TaskQuery(), _DIALECT)
        with self._locked("explain") as conn:
            return [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

    def counts(self) -> dict[TaskStatus, int]:
        with self._locked("counts") as conn:
            rows = conn.execute(_SQL["counts"]).fetchall()
        return {TaskStatus(status): n for status, n in rows}

    def count_tasks(
        self, by: str, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        if by != "bucket" or statuses is not None:
            return super().count_tasks(by, statuses=statuses)
        with self._locked("count_tasks") as conn:  # the bucket index holds no NULL
            rows = conn.execute(_SQL["bucket_totals"]).fetchall()
        return {bucket: n for bucket, n in rows if n}

    # -- audit trail ------------------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        values = codec.transition_to_values(transition)  # encoded before the lock is taken
        with self._write("append") as conn:
            append_rows(conn, [values])

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._locked("history") as conn:
            rows = conn.execute(_SQL["history"], (task_id, since_version)).fetchall()
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
            conn.execute(_SQL["touch_task"], params)

    # -- commands ---------------------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        values = codec.command_to_values(command)  # encoded before the lock is taken
        with self._write("submit_command") as conn:
            conn.execute(_SQL["insert_command"], values)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        now = utc(now, "now")
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        with self._write("claim_commands") as conn:
            rows = conn.execute(
                _SQL["claimable_commands"], (codec.encode_dt(now), limit)
            ).fetchall()
            conn.executemany(_SQL["lease_command"], [(until, r[0]) for r in rows])
        claimed = []
        for r in rows:
            row = dict(zip(codec.COMMAND_COLUMNS, r, strict=True))
            row["lease_until"] = until
            claimed.append(codec.row_to_command(row))
        return claimed

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """Optional capability (``SupportsCommandLog``)."""
        with self._locked("finished_commands") as conn:
            rows = conn.execute(
                _SQL["finished_commands"], (codec.encode_dt(utc(after, "after")), limit)
            ).fetchall()
        return [
            codec.row_to_command(dict(zip(codec.COMMAND_COLUMNS, r, strict=True))) for r in rows
        ]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._write("complete_command") as conn:
            conn.execute(_SQL["complete_command"], (codec.encode_dt(now), outcome, command_id))

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._write("release_command") as conn:
            conn.execute(_SQL["release_command"], (command_id,))

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """Optional capability (not part of ``TaskStore``), used by ``submit``,
        ``submit_many`` and ``submit_pipeline``: ``create`` every snapshot and ``append`` its
        transition in one transaction, all rows encoded before the connection lock is
        taken. All or nothing; an existing id raises ``TaskAlreadyExists``.

        Committed by group commit (``GroupCommit``): it returns once the rows are
        committed, possibly in one transaction with other threads' writes."""
        new: list[Row] = []
        trail: list[Row] = []
        for snapshot, transition in items:
            values = codec.snapshot_to_values(snapshot)
            first = codec.transition_to_values(
                transition,
                # A submit's creation transition is at the task's created_at: encoded once.
                at=values[_CREATED_AT] if transition.at is snapshot.created_at else None,
            )
            if first[0] == values[0]:  # its own transition: one row (NEW_FILLS)
                values += first[1:]
            else:  # another task's (a caller may hand one over): a row of its own
                values += _NO_TRANSITION
                trail.append(first)
            new.append(values)
        self._group_write(WriteRequest(new=new, trail=trail))

    def write_transitions(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition],
    ) -> None:
        """Optional capability (not part of ``TaskStore``), used by the write-through:
        compare-and-set the columns a task's life changes (``codec.LIFE_COLUMNS``; the identity
        columns are fixed at create) and ``append`` the transitions, in one transaction,
        every row encoded before the connection lock is taken. Raises
        ``ConcurrencyConflict`` like ``save``, with nothing written.

        Committed by group commit (``GroupCommit``)."""
        self._group_write(_life_request(snapshot, expect_version, transitions))

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """Optional capability (``SupportsWriteTogether``): ``write_transitions`` for each
        of ``writes``, queued to the group commit together (usually one statement); each
        compare-and-set stands alone. Returns each write's error, ``None`` where it
        landed."""
        requests = [_life_request(*write) for write in writes]
        self._group_write_all(requests)
        return [request.error for request in requests]

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Behind:
        """Optional capability (``SupportsWriteBehind``): ``write_transitions_together``,
        queued to the group commit and not waited for. The writes ride the next batch
        anyone commits (a ``submit``'s create, say), or ``serve()`` / ``wait()`` on what
        is returned commits them; inside ``atomic()`` they are written at once."""
        requests = [_life_request(*write) for write in writes]
        if self._holder != threading.get_ident():
            return self._group.behind(requests)
        self._group_write_all(requests)  # this thread holds the transaction: here, now
        for request in requests:
            request.settled = True
        return Behind(self._group, requests, time.monotonic())

    def _group_write(self, request: WriteRequest) -> None:
        """Commit ``request`` (``_group_write_all``); raise its error."""
        self._group_write_all((request,))
        if request.error is not None:
            raise request.error

    def _group_write_all(self, requests: Sequence[WriteRequest]) -> None:
        """Commit ``requests``, each on its own, leaving each one's error on it: on this
        thread if it already holds the transaction (inside ``atomic()``), each in a
        savepoint; else through the group-commit writer.

        A value SQLite cannot bind (text that is not UTF-8) fails the batch before its
        rows land, and the group commit then redoes the batch request by request, so
        only the caller who handed that value over gets the error."""
        if self._holder != threading.get_ident():
            self._group.run(requests)
            return
        for request in requests:
            try:
                with self._write("write") as conn:
                    request.apply_alone(conn)
            except Exception as exc:
                request.error = exc

    def mark_expired_lost(
        self,
        scan: TaskScan,
        *,
        exclude: frozenset[str],
        at: datetime,
        actor: str,
        verdict: Verdict,
    ) -> list[str]:
        """Optional capability (``SupportsMarkExpired``): ``reconcile()`` in one
        ``BEGIN IMMEDIATE`` transaction: no other writer comes between the judgement and
        the marks."""
        when = codec.encode_dt(at)
        with self._write("mark_expired_lost") as conn:
            (where, where_params), verdicts = verdicts_of_expired(
                conn, scan, _DIALECT, _SQL["expired_owners"], verdict
            )
            if not verdicts:
                return []
            for name in ("lost_verdicts_table", "lost_doomed_table"):
                conn.execute(_SQL[name])
            conn.execute(_SQL["lost_clear_verdicts"])
            conn.execute(_SQL["lost_clear_doomed"])
            conn.executemany(_SQL["lost_verdict"], verdicts)
            conn.execute(
                _SQL["lost_doom"].replace("{scan}", where),
                [*where_params, json.dumps(sorted(exclude))],
            )
            conn.execute(_SQL["lost_mark"], [when])
            conn.execute(_SQL["lost_trail"], [when, actor])
            marked = [task_id for (task_id,) in conn.execute(_SQL["lost_marked"])]
            conn.execute(_SQL["lost_clear_doomed"])
            return marked

    def mark_lost(self, marks: Sequence[tuple[TaskSnapshot, Transition]]) -> set[str]:
        """Optional capability (not part of ``TaskStore``), used by ``reconcile()``.

        For each ``(lost snapshot, its transition)``: compare-and-set ``status``,
        ``status_version``, ``ended_at`` and ``failure`` where the stored version is still
        ``transition.version - 1``, and append the transition only where that won. One
        transaction. Returns the ids marked; the others moved on (their holder is alive).
        """
        if not marks:
            return set()
        once, dt, failure = codec.encoded_once(), codec.encode_dt, codec.encode_failure
        params = [
            (
                m.status.value,
                m.status_version,
                once(m.ended_at, dt),
                once(m.failure, failure),
                m.task_id,
                t.version - 1,
            )
            for m, t in marks
        ]
        wanted = {m.task_id: m.status_version for m, _ in marks}
        with self._write("mark_lost") as conn:
            changed = conn.executemany(_SQL["mark_lost"], params).rowcount
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
                _SQL["append"],
                (
                    codec.transition_to_values(t, at=once(t.at, dt))
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
            keyed = conn.execute(_SQL["prunable"], (keep_terminal,)).fetchall()
            doomed = [(task_id,) for task_id, _ in keyed]
            conn.executemany(_SQL["prune_history"], keyed)
            conn.executemany(_SQL["prune_commands"], doomed)
            conn.executemany(_SQL["prune_task"], doomed)
        return len(doomed)

    def _checkpoint_on_commit(self) -> None:
        """The Checkpointer's fallback: commits checkpoint the WAL themselves again."""
        try:
            with self._locked("checkpoint settings") as conn:
                conn.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT}")
        except StoreError as exc:
            if not self._closed:
                log.error("%s: the WAL will not be checkpointed until close: %s", self.path, exc)

    def close(self) -> None:
        if self._checkpointer is not None:  # first, and outside the lock its fallback takes
            self._checkpointer.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()


_NO_TRANSITION = [None] * (len(codec.TRANSITION_COLUMNS) - 1)
_CREATED_AT = codec.TASK_COLUMNS.index("created_at")
_LIFE_STARTED = codec.LIFE_COLUMNS.index("started_at")  # in life_values(snapshot)
_LIFE_ENDED = codec.LIFE_COLUMNS.index("ended_at")

# Pages in the WAL past which a commit checkpoints, where commits do (without the
# Checkpointer's thread): task rows are rewritten several times in their first second, so
# a hot page is copied back once, not once per transition.
_AUTOCHECKPOINT = 8192


def _nothing() -> None:
    return None


def _checkpointer_of(store: SqliteTaskStore) -> Checkpointer:
    """``store``'s Checkpointer. Its thread holds the store only weakly: a store its
    owner drops without ``close()`` is still collected, and its thread then ends (as the
    connection of a dropped store always closed)."""
    ref = weakref.ref(store)
    store_path = store.path

    def hold() -> ReadScope:
        found = ref()
        if found is None:
            raise StoreError(f"SqliteTaskStore({store_path}) is gone")
        return found._locked("checkpoint")

    def fallback() -> None:
        found = ref()
        if found is not None:
            found._checkpoint_on_commit()

    checkpointer = Checkpointer(store_path, hold=hold, fallback=fallback)
    weakref.finalize(store, checkpointer.close, 0)  # no waiting inside a collection
    return checkpointer


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _pragma_value(conn: sqlite3.Connection, name: str) -> str:
    """A pragma's value as it is set again (secure_delete reads 2 for FAST, and a 2 set
    would turn it on)."""
    (value,) = conn.execute(f"PRAGMA {name}").fetchone()
    return "FAST" if name == "secure_delete" and value == 2 else str(value)


def _rebuild_trail(conn: sqlite3.Connection) -> None:
    """Schemas 9 and 11, in the migration's transaction, for a file made before schema
    11. Before schema 9 tasks get ``seq`` (each task keeps its rowid, so the order tasks
    were made in): the table is made again, as SQLite adds no primary key to a table.
    The trail is copied into the rowid table schema 11 keys by ``seq * 16777216 +
    version``, each row under the seq its task has now (found by ``task_id``), in key
    order; a row whose task is not held goes to ``loose_transitions`` (before schema 10
    such rows waited in the trail under seq 0), which is made again with the trail's
    CHECK on versions. The view's triggers are dropped first (they name the old
    columns); the schema makes them again, with the indexes."""
    for trigger in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    # For the copy alone: a page cache that holds the tables, and the old pages freed
    # without zeroing them first (they hold what the new tables hold; Debian's SQLite
    # zeroes every freed page, which wrote the old tables out once more).
    restore = [
        f"PRAGMA {name} = {_pragma_value(conn, name)}" for name in ("cache_size", "secure_delete")
    ]
    conn.execute("PRAGMA cache_size = -524288")  # 512 MiB
    conn.execute("PRAGMA secure_delete = FAST")
    if _columns(conn, "tasks")[:1] != ["seq"]:  # before schema 9
        task_columns = ", ".join(codec.TASK_COLUMNS)
        _make_as(conn, "tasks", "tasks_9")
        conn.execute(
            f"INSERT INTO tasks_9 (seq, {task_columns}) "
            f"SELECT rowid, {task_columns} FROM tasks ORDER BY rowid"
        )
        conn.execute("DROP TABLE tasks")
        conn.execute("ALTER TABLE tasks_9 RENAME TO tasks")
    trail_columns = ", ".join(codec.TRANSITION_COLUMNS)
    trail_values = ", ".join(f"r.{c}" for c in codec.TRANSITION_COLUMNS)
    # The loose trail gains the trail's CHECK on versions (schema 11): made again too.
    _make_as(conn, "loose_transitions", "loose_11")
    if _columns(conn, "loose_transitions"):  # schema 10
        conn.execute(f"INSERT INTO loose_11 SELECT {trail_columns} FROM loose_transitions")
        conn.execute("DROP TABLE loose_transitions")
    conn.execute("ALTER TABLE loose_11 RENAME TO loose_transitions")
    _make_as(conn, "transitions", "trail_11")
    # In key order, so each row lands at the right edge (in any other order, rows split
    # pages anywhere in the new tree).
    conn.execute(
        f"INSERT INTO trail_11 (key, {trail_columns}) "
        f"SELECT t.seq * 16777216 + r.version, {trail_values} "
        "FROM transitions r JOIN tasks t ON t.task_id = r.task_id "
        "WHERE 1 ORDER BY 1 ON CONFLICT DO NOTHING"
    )
    conn.execute(
        f"INSERT INTO loose_transitions ({trail_columns}) SELECT {trail_values} "
        "FROM transitions r WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = r.task_id) "
        "ON CONFLICT DO NOTHING"
    )
    conn.execute("DROP TABLE transitions")
    conn.execute("ALTER TABLE trail_11 RENAME TO transitions")
    for pragma in restore:
        conn.execute(pragma)


def _make_as(conn: sqlite3.Connection, table: str, name: str) -> None:
    """Make ``table`` as the schema makes it (its ``schema_`` block), named ``name``."""
    made = _SQL[f"schema_{table}"]
    conn.execute(made.replace(f"IF NOT EXISTS {table} (", f"{name} (", 1))


def _life_request(
    snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
) -> WriteRequest:
    """A compare-and-set of the columns a task's life changes, with its trail, as rows
    of the write view: the life row (``LIFE_FILLS``) carries the last transition, the
    others are trail rows of their own."""
    task_id = snapshot.task_id
    lived = codec.life_values(snapshot)
    life = [task_id, *lived, expect_version]
    # A worker's start and end transitions are at the run's started_at and ended_at (the
    # same objects): each time is encoded once, not once a transition (two encodings a
    # quick task's life write, where there were five).
    started, ended = snapshot.started_at, snapshot.ended_at
    started_text, ended_text = lived[_LIFE_STARTED], lived[_LIFE_ENDED]
    trail: list[Row] = [
        codec.transition_to_values(
            t,
            at=ended_text if t.at is ended else started_text if t.at is started else None,
        )
        for t in transitions
    ]
    if trail and trail[-1][0] == task_id:
        life += trail.pop()[1:]
    else:  # none, or another task's (a caller may hand one over): trail rows only
        life += _NO_TRANSITION
    return WriteRequest(life=[life], trail=trail, expect=(task_id, expect_version))
