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
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from ...errors import ConcurrencyConflict, ConfigurationError, StoreError, TaskAlreadyExists
from ...model import (
    BRIEF_MESSAGE,
    Command,
    Progress,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ...values import ValueRules
from .. import codec
from ..capabilities import Verdict
from ..roles import CountBy, LifeWrite
from ..sql import (
    Dialect,
    encoded_tag,
    load_named,
    query_sql,
    verdicts_of_expired,
)
from ..sql_store import SqlStore
from .checkpoint import Checkpointer
from .connection import ReadScope, SqliteConnection, WriteScope
from .group import Behind, GroupCommit, Row, WriteRequest, adopt_loose, append_rows
from .schema import AUTOCHECKPOINT, PAGE_SIZE, SCHEMA_VERSION, open_schema
from .wakeups import announce, subscribe, wake_directory

__all__ = [
    "DEFAULT_DURABILITY",
    "DURABILITIES",
    "PAGE_SIZE",
    "SCHEMA_VERSION",
    "Durability",
    "SqliteTaskStore",
]

log = logging.getLogger("chongming_task.store")

Durability = Literal["full", "normal"]
DURABILITIES: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}
"""Each ``durability`` and the ``PRAGMA synchronous`` it sets."""
DEFAULT_DURABILITY: Durability = "normal"

_SQL = load_named(__package__)
# save writes every column but the lease, in queries.sql's order (docs/design.md, "Leases
# are not heartbeats").
_SAVE_VALUE_COLUMNS = tuple(c for c in codec.SAVE_COLUMNS if c != "task_id")
_SELECT_TASKS = "SELECT " + ", ".join(codec.TASK_COLUMNS) + " FROM tasks"
# A list's columns: no result, no traceback, a progress message cut (TaskQuery.brief).
_MESSAGE = "json_extract(progress, '$.message')"
_BRIEF = {
    "outcome": "NULL",
    "failure": "json_remove(failure, '$.traceback')",
    "progress": f"CASE WHEN length({_MESSAGE}) > {BRIEF_MESSAGE} THEN json_set(progress, "
    f"'$.message', substr({_MESSAGE}, 1, {BRIEF_MESSAGE})) ELSE progress END",
}
_DIALECT = Dialect(
    select=_SELECT_TASKS,
    brief_select="SELECT "
    + ", ".join(_BRIEF.get(c, c) for c in codec.TASK_COLUMNS)
    + " FROM tasks",
    placeholder="?",
    unindexed=lambda column: f"+{column}",
    one_of=lambda column, values: (f"{column} IN ({', '.join('?' * len(values))})", values),
    prefix=lambda column, text: (f"substr({column}, 1, ?) = ?", [len(text), text]),
    glob=lambda column, glob: (f"{column} GLOB ?", [glob.sqlite()]),
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
    # Fixed-width text (codec.encode_dt): whole seconds, then six digits of fraction.
    micros=lambda c: f"(CAST(strftime('%s', {c}) AS INTEGER) * 1000000 + substr({c}, 21, 6))",
    trail_of_task=(
        "tr.key = tasks.seq * 16777216 + tasks.status_version AND tr.task_id = tasks.task_id"
    ),
)


def _create_private(path: str) -> None:
    """A database file that does not exist yet is made ``0600``, whatever the umask:
    results and tracebacks are nobody else's to read. SQLite gives the file's ``-wal``
    and ``-shm`` the database's own mode. An existing file keeps the mode it has."""
    if path.startswith("file:"):
        return  # a URI: SQLite's to open
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError:
        return  # SQLite's own open says what is wrong, in the store's words
    os.close(fd)


class SqliteTaskStore(SqlStore):
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
        durability: Durability = DEFAULT_DURABILITY,
    ) -> None:
        """A store in the SQLite file at ``path`` (``":memory:"``: one in this process's
        memory, gone with it). ``timeout``: seconds a write waits for another process's
        lock before it fails (``StoreUnavailable``).

        ``create=False`` refuses a file that does not exist or holds no tasks table;
        ``upgrade=False`` refuses a file of an older schema instead of upgrading it (the
        CLI's commands other than ``migrate`` and ``run``: an upgraded file is one the
        running nodes of an older release can no longer use, and some upgrades rebuild
        the trail while every other process waits).

        ``durability`` is what a commit this store acknowledged survives
        (docs/design.md, "What a commit survives"): ``"full"`` flushes the WAL to the
        disk at each commit (one a group commit, however many writes share it), so an
        acknowledged write survives a power cut or an OS crash; ``"normal"`` leaves the
        flush to checkpoints, so an acknowledged write survives the process's crash but
        the last commits before a power cut may be lost (the file stays consistent)."""
        if durability not in DURABILITIES:
            raise ConfigurationError(
                f"durability must be one of {', '.join(DURABILITIES)}, not {durability!r}"
            )
        self.durability: Durability = durability
        """What an acknowledged commit of this store survives (see ``__init__``)."""
        self.path = str(path)
        memory = self.path == ":memory:"
        if not memory and not create and not Path(self.path).exists():
            raise StoreError(f"no database at {self.path}")
        if not memory and create:
            _create_private(self.path)
        self.connection = link = SqliteConnection(self.path, timeout=timeout)
        super().__init__(statements=_SQL, dialect=_DIALECT, scope=link.scope)
        self._wake_directory = None if memory else wake_directory(os.path.realpath(self.path))
        self._wakes: list[Callable[[], None]] = []  # a file in memory: this store's own
        """The store's one connection and its lock: for tools and tests that read or
        trace the file's SQL directly (a write through it bypasses the store's rules)."""
        # A file's WAL is copied back by a thread of its own, never by a committing caller.
        self.checkpointer = None if memory else _checkpointer_of(link)
        """The thread of the store's own that copies the WAL back (``None`` in memory)."""
        if self.checkpointer is not None:
            link.committed = self.checkpointer.committed
        link.group = self._group = GroupCommit(
            lock=link.lock,
            in_transaction=link.in_transaction,
            statement=link.read,
            transaction=link.write,
            not_text=link.not_text,
            committed=link.committed,
        )
        try:
            with link.guard("open"):
                open_schema(
                    link,
                    memory=memory,
                    create=create,
                    timeout=timeout,
                    upgrade=upgrade,
                    synchronous=DURABILITIES[durability],
                )
        except StoreError:
            link.close()
            raise

    group_commit = True
    """Writes made side by side share a statement (``GroupCommit``)."""

    value_rules = ValueRules(nul_in_text=True)
    """SQLite keeps any UTF-8 text, NUL included (see ``chongming_task.values``)."""

    def __repr__(self) -> str:
        return f"SqliteTaskStore({self.path!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _locked(self, what: str) -> ReadScope:
        """``with self._locked(what) as conn``: the connection, under its lock."""
        return self.connection.read(what)

    def _write(self, what: str) -> WriteScope:
        """A write transaction (``SqliteConnection.write``)."""
        return self.connection.write(what)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """``SupportsAtomic``: the calls made inside commit
        together or not at all. The write-through uses it to land a ``save`` and its
        ``append`` calls in one transaction."""
        with self._write("atomic"):
            yield

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

    def explain_query(self, query: TaskQuery | None = None) -> list[str]:
        """SQLite's plan for ``query(query)``: proof that a filter uses its index."""
        sql, params = query_sql(query or TaskQuery(), _DIALECT)
        with self._locked("explain") as conn:
            return [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

    def count_tasks(
        self, by: CountBy, *, statuses: frozenset[TaskStatus] | None = None
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
        if self._wake_directory is not None:  # committed: wake the processes on this file
            announce(self._wake_directory)
        for wake in list(self._wakes):
            wake()

    def subscribe_commands(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """``CommandChannel``: call ``wake()`` soon after
        any process submits a command on this file, through a named pipe of this
        process (``wakeups``); polling stays the truth. Returns the function that stops
        it, or ``None`` where no pipe can be made."""
        if self._wake_directory is None:  # in memory: no other process can send one
            self._wakes.append(wake)
            return lambda: self._wakes.remove(wake) if wake in self._wakes else None
        return subscribe(self._wake_directory, wake, name=f"chongming-wake[{self.path}]")

    def subscribe_commands_for(
        self, holder: str, wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        """``CommandChannel``: every command wakes every process on the file (a pipe
        carries no address; the nodes of one machine are few)."""
        return self.subscribe_commands(wake)

    def subscribe_transitions(self, wake: Callable[[], None]) -> None:
        """``CommandChannel``: none (a follower of this file polls it)."""
        return None

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """``BatchedWrites``, used by ``submit``,
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
        """``BatchedWrites``, used by the write-through:
        compare-and-set the columns a task's life changes (``codec.LIFE_COLUMNS``; the identity
        columns are fixed at create) and ``append`` the transitions, in one transaction,
        every row encoded before the connection lock is taken. Raises
        ``ConcurrencyConflict`` like ``save``, with nothing written.

        Committed by group commit (``GroupCommit``)."""
        self._group_write(_life_request(snapshot, expect_version, transitions))

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """``BatchedWrites``: ``write_transitions`` for each
        of ``writes``, queued to the group commit together (usually one statement); each
        compare-and-set stands alone. Returns each write's error, ``None`` where it
        landed."""
        requests = [_life_request(*write) for write in writes]
        self._group_write_all(requests)
        return [request.error for request in requests]

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Behind:
        """``BatchedWrites``: ``write_transitions_together``,
        queued to the group commit and not waited for. The writes ride the next batch
        anyone commits (a ``submit``'s create, say), or ``serve()`` / ``wait()`` on what
        is returned commits them; inside ``atomic()`` they are written at once."""
        requests = [_life_request(*write) for write in writes]
        if not self.connection.held_here():
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
        if not self.connection.held_here():
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
        """``Maintenance``: ``reconcile()`` in one
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
        """``BatchedWrites``, used by ``reconcile()``.

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
            conn.executemany(_SQL["prune_late_report"], doomed)
            conn.executemany(_SQL["prune_hold"], doomed)
            conn.executemany(_SQL["prune_task"], doomed)
            if doomed:
                conn.execute(_SQL["prune_orphan_pipelines"])
        return len(doomed)

    def space(self) -> tuple[int, int]:
        """The file's size and how much of it is free pages, in bytes (by its pages: the
        write-ahead log aside). Free pages are reused by new tasks; ``compact`` gives
        them back to the disk."""
        with self._locked("space") as conn:
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            size = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return size * page, free * page

    def compact(self) -> int:
        """Rewrite the file without its free pages (``VACUUM``); the bytes it gave back.
        Every writer, in this process and others, waits while it runs (about a second
        for each 100 MiB kept); readers go on."""
        before, _ = self.space()
        with self._locked("compact") as conn:  # VACUUM runs outside a transaction
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return before - self.space()[0]

    def close(self) -> None:
        if self.checkpointer is not None:  # first, and outside the lock its fallback takes
            self.checkpointer.close()
        self.connection.close()


_NO_TRANSITION = [None] * (len(codec.TRANSITION_COLUMNS) - 1)
_CREATED_AT = codec.TASK_COLUMNS.index("created_at")
_LIFE_STARTED = codec.LIFE_COLUMNS.index("started_at")  # in life_values(snapshot)
_LIFE_ENDED = codec.LIFE_COLUMNS.index("ended_at")


def _checkpointer_of(link: SqliteConnection) -> Checkpointer:
    """The connection's Checkpointer. Its thread holds the connection only weakly: a
    store its owner drops without ``close()`` is still collected, and its thread then
    ends (as the connection of a dropped store always closed)."""
    ref = weakref.ref(link)
    path = link.path

    def hold() -> ReadScope:
        found = ref()
        if found is None:
            raise StoreError(f"SqliteTaskStore({path}) is gone")
        return found.read("checkpoint")

    def fallback() -> None:
        """Commits checkpoint the WAL themselves again."""
        found = ref()
        if found is None:
            return
        try:
            with found.read("checkpoint settings") as conn:
                conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT}")
        except StoreError as exc:
            if not found.closed:
                log.error("%s: the WAL will not be checkpointed until close: %s", path, exc)

    checkpointer = Checkpointer(path, hold=hold, fallback=fallback)
    weakref.finalize(link, checkpointer.close, 0)  # no waiting inside a collection
    return checkpointer


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
