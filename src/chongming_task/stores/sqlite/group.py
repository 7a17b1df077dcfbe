"""SQLite group commit: the writes threads queue while the connection is busy land
together (``GroupCommit``): a batch of up to 64 rows as one statement through the
``task_writes`` view of ``schema.sql``, a larger one straight into the tables.

Each row of a batch is one row of that view: ``kind`` ("new", "life" or "trail"), the
task's columns, ``expect`` (a compare-and-set's expected version), then the trail's
columns after ``task_id``. ``WRITE_VIEW_COLUMNS`` is that order (a test compares it with
the view the schema makes). A row binds only the columns its kind fills (a new task's
``NEW_FILLS``, with its first transition; a compare-and-set's ``LIFE_FILLS``, with the
write's last; a transition's); the statement says NULL for the rest.

Why two ways. Each statement releases the interpreter's lock, and a thread that submits
one task at a time must win it back after every one, behind the workers: a small batch
goes as one statement (every batch straight into the tables, four or five statements
each, made per-call ``submit`` 17 % slower: 2,738 against 3,306/s, medians of 8
alternating runs). But SQLite runs the view's three ``INSTEAD OF`` triggers for every
row, each in a frame of its own (a task's create and life: 411k instructions through
the view, 301k straight into the tables); in a large batch that is the cost, and a few
statements more are nothing (``submit_many`` by 100: 6,151 -> 7,181/s, the same runs).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from itertools import chain
from typing import Any

from ...errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from .. import codec
from ..sql import load_named
from ..sql_store import DEDUPE_HELD, KeyHeld

__all__ = [
    "LIFE_FILLS",
    "NEW_FILLS",
    "WRITE_VIEW_COLUMNS",
    "Behind",
    "GroupCommit",
    "WriteRequest",
    "adopt_loose",
    "append_rows",
]

_TRAIL_VALUES = tuple(c for c in codec.TRANSITION_COLUMNS if c != "task_id")
WRITE_VIEW_COLUMNS = ("kind", *codec.TASK_COLUMNS, "expect", *_TRAIL_VALUES)
_CONFLICT_MESSAGE = "chongming-task: status_version moved"  # raised by task_writes_life
Scope = Callable[[str], AbstractContextManager[sqlite3.Connection]]
"""A store scope: ``with scope(what) as conn`` (``what`` names the work in errors)."""

_ROWS_PER_STATEMENT = 64  # 64 x 25 bound values at most, well under SQLite's limit (32766)

LIFE_FILLS = ("task_id", *codec.LIFE_COLUMNS, "expect", *_TRAIL_VALUES)
"""The values of a ``life`` row, in this order: the compare-and-set, then the write's
last transition after ``task_id`` (``None`` without one): what ``task_writes_life``
reads."""
_LIFE_WIDTH = len(codec.LIFE_COLUMNS) + 2  # task_id, the columns, expect

NEW_FILLS = (*codec.TASK_COLUMNS, *_TRAIL_VALUES)
"""The values of a ``new`` row: the task's columns, then its first transition's after
``task_id`` (``None`` for a task without one): what ``task_writes_new`` reads."""
_TASK_WIDTH = len(codec.TASK_COLUMNS)
_DEDUPE_KEY = codec.TASK_COLUMNS.index("dedupe_key")
_CREATED = codec.TASK_COLUMNS.index("created_at")

# Which columns of the view each kind of row fills, in the view's order. The others are
# NULL in the statement's text, not bound: Python's sqlite3 passes every bound value that
# is not exactly an int, float or str through its adapter registry, None included, and
# each such lookup formats an AttributeError that it then throws away (CPython 3.11); a
# task's life bound ~110 None of padding, which cost a third of its instructions.
#
# A None a filled column holds (a new task's ended_at, say: ~17 a task life) would take
# that path too: an adapter registered for None (it gives None back, bound as NULL, as
# without one) is found in the registry before the lookup that formats. Process-wide, as
# sqlite3's registry is, and only where nobody registered one: what sqlite3 does with a
# None stays what it did.
sqlite3.adapters.setdefault((type(None), sqlite3.PrepareProtocol), {}.get)
_FILLS = {"new": NEW_FILLS, "life": LIFE_FILLS, "trail": codec.TRANSITION_COLUMNS}
for _kind, _fills in _FILLS.items():
    assert [c for c in WRITE_VIEW_COLUMNS if c in _fills] == list(_fills), _kind
_TEMPLATE = {
    kind: f"('{kind}', "
    + ", ".join("?" if c in fills else "NULL" for c in WRITE_VIEW_COLUMNS[1:])
    + ")"
    for kind, fills in _FILLS.items()
}
_WRITE_HEAD = f"INSERT INTO task_writes ({', '.join(WRITE_VIEW_COLUMNS)}) VALUES "


@functools.lru_cache(maxsize=512)  # as many as the connection's statement cache
def _write_sql(new: int, life: int, trail: int) -> str:
    """The statement for a part with this many rows of each kind, in that order (the same
    string object each time: the sqlite3 statement cache looks it up by a cached hash)."""
    rows = [_TEMPLATE["new"]] * new + [_TEMPLATE["life"]] * life + [_TEMPLATE["trail"]] * trail
    return _WRITE_HEAD + ", ".join(rows)


Row = Sequence[Any]

_INSERT_TASKS = (
    f"INSERT INTO tasks ({', '.join(codec.TASK_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(codec.TASK_COLUMNS))})"
)
# A life row's first values in LIFE_FILLS order, numbered: task_id ?1, then the columns,
# then expect.
_UPDATE_LIFE = (
    "UPDATE tasks SET "
    + ", ".join(f"{c} = ?{i + 2}" for i, c in enumerate(codec.LIFE_COLUMNS))
    + f" WHERE task_id = ?1 AND status_version = ?{_LIFE_WIDTH}"
)
_SQL = load_named(__package__)


def append_rows(conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
    """Trail rows (a transition's values each): under their task's seq, or loose while
    the store does not hold their task (``loose_transitions``)."""
    if conn.executemany(_SQL["append"], rows).rowcount != len(rows):
        conn.executemany(_SQL["append_loose"], rows)  # only the rows of tasks not held


def adopt_loose(conn: sqlite3.Connection) -> None:
    """After tasks were inserted outside the write view: their loose trail rows join
    them (nearly always there are none)."""
    conn.execute(_SQL["adopt_loose"])
    conn.execute(_SQL["adopt_loose_done"])


class _VersionMoved(Exception):
    """A compare-and-set of a batch written straight into the tables changed no row
    (the transaction is then rolled back)."""


def _write_rows(
    conn: sqlite3.Connection,
    new: list[Row],
    life: list[Row],
    trail: list[Row],
    one: bool | None = None,
) -> None:
    """Write the rows kind by kind (new tasks, then compare-and-sets, then the trail):
    up to 64 rows as one statement into the write view (its own transaction, or part of
    the caller's), more straight into the tables (the caller holds a transaction). Rows
    keep their order within a kind, new tasks come before any compare-and-set (the
    runtime queues a task's start only once its create has committed; a direct caller's
    create and first write in one batch still both land), and the trail is its own
    table: the order of kinds changes the statements, not what a batch writes.

    A compare-and-set that finds another version raises: an ``IntegrityError`` from the
    view's trigger, ``_VersionMoved`` from the tables; either way the caller undoes it
    all. ``one``: ``_one_statement(new, life, trail)``, if the caller asked already."""
    if not (new or life or trail):
        return
    if one is None:
        one = _one_statement(new, life, trail)
    if one:
        sql = _write_sql(len(new), len(life), len(trail))
        conn.execute(sql, [*chain(*new, *life, *trail)])  # flat, in C: ~80 values a task
        return
    width, cas = _TASK_WIDTH, _LIFE_WIDTH
    if new:
        conn.executemany(_INSERT_TASKS, [row[:width] for row in new if row[_DEDUPE_KEY] is None])
        for row in new:  # one by one, each key checked as the write view's trigger does
            key = row[_DEDUPE_KEY]
            if key is not None:
                if conn.execute(_SQL["dedupe_held"], (key, row[_CREATED])).fetchone():
                    raise sqlite3.IntegrityError(DEDUPE_HELD)
                conn.execute(_INSERT_TASKS, row[:width])
        adopt_loose(conn)
    if life and conn.executemany(_UPDATE_LIFE, [row[:cas] for row in life]).rowcount != len(life):
        raise _VersionMoved
    carried = [(row[0], *row[width:]) for row in new if row[width] is not None]
    carried += [(row[0], *row[cas:]) for row in life if row[cas] is not None]
    if carried or trail:
        append_rows(conn, [*carried, *trail])


def _one_statement(new: list[Row], life: list[Row], trail: list[Row]) -> bool:
    """Whether a batch of these rows is written as one statement into the write view
    (else straight into the tables, in a transaction)."""
    return len(new) + len(life) + len(trail) <= _ROWS_PER_STATEMENT


class WriteRequest:
    """One caller's write, as rows of the write view by kind: new tasks, each row with
    its first transition (``create_many``), or one task's compare-and-set with its trail
    (``write_transitions``)."""

    __slots__ = ("done", "error", "expect", "life", "new", "queued_at", "settled", "trail")

    def __init__(
        self,
        *,
        new: list[Row] | None = None,
        life: list[Row] | None = None,
        trail: list[Row],
        expect: tuple[str, int] | None = None,
    ) -> None:
        self.new = new or []
        self.life = life or []
        self.trail = trail
        self.expect = expect
        self.error: BaseException | None = None
        self.settled = False  # committed or failed (set before ``done`` is released)
        self.queued_at = 0.0  # monotonic, for a write that may wait
        self.done = threading.Lock()
        self.done.acquire()  # released once the request is committed or has failed

    @property
    def task_id(self) -> str:
        """The (first) task this request writes, for errors."""
        first = self.new or self.life or self.trail
        return str(first[0][0]) if first else "?"

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
            try:
                _write_rows(conn, self.new, self.life, self.trail)
            except sqlite3.IntegrityError as exc:
                if self.expect is None or _CONFLICT_MESSAGE not in str(exc):
                    raise
                raise _VersionMoved from None
        except _VersionMoved:
            assert self.expect is not None  # only a compare-and-set moves no row
            task_id, expected = self.expect
            found = conn.execute(_SQL["stored_version"], (task_id,)).fetchone()
            raise ConcurrencyConflict.version_mismatch(
                task_id, expected, None if found is None else found[0]
            ) from None
        except sqlite3.IntegrityError as exc:
            if DEDUPE_HELD in str(exc):
                raise KeyHeld(f"task {self.task_id}: its dedupe key is held") from None
            if "CHECK constraint failed" in str(exc):  # the trail's version (schema 11)
                raise StoreError(
                    f"write of task {self.task_id} refused: a transition's version is past "
                    f"what the trail keys (0 to 16777215): {exc}"
                ) from exc
            if self.new:
                raise TaskAlreadyExists(f"a task id among {len(self.new)} already exists") from None
            raise


_MAX_BATCH = 256
# A batch failed on one caller's fault (nothing of it was written): find who, alone.
# Text is not checked before a request joins a batch: a value SQLite cannot bind fails
# the statement before it runs, and the redo isolates it, at no cost to the others.
_ONE_CALLERS_FAULT = (sqlite3.IntegrityError, UnicodeEncodeError)


class Behind:
    """Requests queued by ``GroupCommit.behind``, not waited for: what the store's
    ``write_transitions_behind`` returns (``PendingWrites``)."""

    __slots__ = ("_group", "_requests", "queued_at")

    def __init__(self, group: GroupCommit, requests: Sequence[WriteRequest], at: float) -> None:
        self._group = group
        self._requests = requests
        self.queued_at = at

    @property
    def settled(self) -> bool:
        # Batches go in queue order, and a batch settles its requests in order: the
        # last settled, they all are.
        return not self._requests or self._requests[-1].settled

    def errors(self) -> list[BaseException | None]:
        return [request.error for request in self._requests]

    def serve(self) -> None:
        if self._requests:
            self._group.serve(self._requests[-1])

    def wait(self) -> None:
        self._group.settle(self._requests, GroupCommit.RETRY)


class GroupCommit:
    """Group commit for the write-through and submit paths, by flat combining: a thread
    that finds the connection free commits its own write and every write queued by other
    threads together: up to 64 rows as one INSERT into the ``task_writes`` view (a
    single statement is its own transaction), more in one transaction straight into
    the tables (``_write_rows``). A thread that finds the connection busy
    queues its write and sleeps until a combiner has committed it. Every call is still
    durable when it returns; an uncontended write runs on its own thread, no hand-off.

    Why: with one connection taken by lock, worker threads queued behind whoever held it
    across a GIL switch; every statement released the GIL that its thread then had to win
    back; and every commit rewrote the same hot pages (a task row's leaf, the status
    index, the trail) in the WAL. Here a waiter never takes the lock again after waking,
    a small batch costs one statement, and it writes shared pages once. (A dedicated writer
    thread was measured too: two thread hand-offs per write cost ~90 us on the reference
    VM.)

    Writes that may wait (``behind()``: the workers' writes, queued and not waited for)
    are the exception: a thread
    that has committed its own write leaves them queued unless a caller's write is
    queued too, so they ride with the next caller's write (a loop of ``submit``: a run's
    end shares the next create's commit, 1.45 commits a task became 1.0); past
    ``WAIT`` the thread that waits on them commits them (``settle()``), and writes
    queued behind are committed by whoever serves them (the node's ``BehindWriter``).

    If the statement fails on a constraint (a compare-and-set found another version, or
    a new id exists), nothing of the batch was written: it is redone request by request
    in one transaction, each in a savepoint, so the failing requests raise on their own
    and the others land. Any other error fails every request in the batch, with nothing
    written.
    """

    # How long a write that may wait waits for a caller's write to ride with.
    WAIT = 0.0005
    # Safety net only: whoever releases the store's lock serves every caller's write
    # queued, and every write that may wait once it has waited WAIT, so a queued write
    # is never left without a thread to commit it.
    RETRY = 0.05

    def __init__(
        self,
        *,
        lock: threading.RLock,
        in_transaction: Callable[[], bool],
        statement: Scope,
        transaction: Scope,
        not_text: Callable[[UnicodeEncodeError, str], StoreError],
        committed: Callable[[], None],
    ) -> None:
        """``lock`` is the store's connection lock; ``in_transaction`` says whether the
        thread holding it is inside ``atomic()``; ``statement`` runs one statement as its
        own transaction, ``transaction`` opens ``BEGIN IMMEDIATE ... COMMIT`` (both take
        the lock, and translate the driver's errors); ``not_text`` words a value SQLite
        cannot bind (text that is not UTF-8) as the store's error; ``committed`` is
        called after each batch's statement has committed."""
        self._lock = lock
        self._in_transaction = in_transaction
        self._statement = statement
        self._transaction = transaction
        self._not_text = not_text
        self._committed = committed
        # append / popleft: atomic. Callers' writes, and writes that may wait.
        self._queue: deque[WriteRequest] = deque()
        self._waiting: deque[WriteRequest] = deque()
        self._server: int | None = None  # the thread committing a batch, under the lock
        self.commits = 0
        """Batches committed so far, and the writes they carried (``writes``): how
        well the group commit groups, for benches and tools (written under the lock)."""
        self.writes = 0

    @property
    def queued(self) -> int:
        """Callers' writes waiting for a batch to carry them."""
        return len(self._queue)

    @property
    def queued_behind(self) -> int:
        """Writes queued behind (``behind()``) that no batch carried yet."""
        return len(self._waiting)

    @property
    def pending(self) -> bool:
        """Whether writes are queued (a releaser of the lock then calls ``serve()``)."""
        return bool(self._queue or self._waiting)

    def run(self, requests: Sequence[WriteRequest]) -> None:
        """Commit one caller's ``requests`` (each of another task), queued together so
        that one batch usually commits them all; returns once each is committed or has
        failed, its error left on it (``error``), none raised."""
        # Queue first, then try the lock: if the try fails, the holder has not released
        # yet, and it looks at the queue after releasing (see serve()).
        self._queue.extend(requests)
        self.settle(requests, self.RETRY)

    def behind(self, requests: Sequence[WriteRequest]) -> Behind:
        """Queue ``requests`` as writes that may wait, and return at once: they ride the
        next batch committed, or ``serve()`` / ``settle()`` commits them."""
        now = time.monotonic()
        for request in requests:
            request.queued_at = now
        self._waiting.extend(requests)
        return Behind(self, requests, now)

    def settle(self, requests: Sequence[WriteRequest], wait: float) -> None:
        """Return once each of ``requests`` (queued) is committed or has failed:
        commit them if the lock is free, else wait for whoever holds it (looking again
        after ``wait``, then every ``RETRY``)."""
        if not requests:
            return
        last = requests[-1]  # batches go in queue order: the others settle before it
        self.serve(last)
        for request in requests:
            if request.settled:
                continue  # its done lock stays released: settling again never blocks
            while not request.done.acquire(timeout=wait):
                self.serve(last)
                wait = self.RETRY  # past WAIT: whoever releases the lock commits it
            request.done.release()

    def serve(self, mine: WriteRequest | None = None) -> None:
        """Commit queued writes, a batch at a time, while there are some and the store's
        lock is free; once ``mine`` (the caller's own) is settled, only while a caller's
        write is queued. Called by writers and after every release of the lock."""
        lock = self._lock
        queue_, waiting = self._queue, self._waiting
        me = threading.get_ident()
        if self._server == me:
            return  # the scopes of our own commit end here: the loop below continues
        while (queue_ or (waiting and self._due(mine))) and lock.acquire(blocking=False):
            try:
                if self._in_transaction():
                    return  # this thread is inside atomic(): never commit others' writes there
                self._server = me
                batch: list[WriteRequest] = []
                while queue_ and len(batch) < _MAX_BATCH:
                    batch.append(queue_.popleft())
                while waiting and len(batch) < _MAX_BATCH:
                    batch.append(waiting.popleft())
                if batch:
                    self._commit(batch)
            finally:
                self._server = None
                lock.release()

    def _due(self, mine: WriteRequest | None) -> bool:
        """Whether the writes that may wait go now (some are queued): always, until the
        caller's own write (``mine``) is settled; after, once the oldest has waited
        ``WAIT`` (a caller who commits one write at a time is back sooner)."""
        if mine is None or not mine.settled:
            return True
        try:
            oldest = self._waiting[0]
        except IndexError:  # taken meanwhile by another thread
            return False
        return oldest.queued_at <= time.monotonic() - self.WAIT

    def _commit(self, batch: list[WriteRequest]) -> None:
        """Called holding the store's lock."""
        new: list[Row] = []
        life: list[Row] = []
        trail: list[Row] = []
        for request in batch:  # one pass, not three comprehensions (a frame each)
            new += request.new
            life += request.life
            trail += request.trail
        # The common case, one statement, is its own transaction; more take one.
        one = _one_statement(new, life, trail)
        scope = self._statement if one else self._transaction
        try:
            try:
                with scope("group commit") as conn:
                    _write_rows(conn, new, life, trail, one)
                self.commits += 1
                self.writes += len(batch)
                if one:  # its own transaction (the other scope tells on its commit)
                    self._committed()
            except _VersionMoved:
                self._one_by_one(batch)  # nothing was written: find who failed
            except StoreError as exc:
                if not isinstance(exc.__cause__, _ONE_CALLERS_FAULT):
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
                    request.settled = True
                    request.done.release()
                raise
        for request in batch:
            request.settled = True
            request.done.release()

    def _one_by_one(self, batch: list[WriteRequest]) -> None:
        """A conflict, an existing id or a value SQLite cannot bind somewhere in the batch
        undid it all: redo it in one transaction, each request in a savepoint, so only
        the failing ones fail."""
        with self._transaction("group commit") as conn:
            for request in batch:
                try:
                    request.apply_alone(conn)
                except (ConcurrencyConflict, TaskAlreadyExists, StoreError) as exc:
                    request.error = exc  # its own failure: nothing of it written
                except UnicodeEncodeError as exc:  # refused at bind: nothing of it written
                    request.error = self._not_text(exc, f"write of task {request.task_id}")
