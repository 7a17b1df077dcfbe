"""``PostgresTaskStore``: one store shared by nodes on different machines.

psycopg 3 with a real connection pool shared by the controller's threads, in
autocommit: a method of one statement is one round trip, and every method is one short
transaction (no transaction or row lock is ever held while a task runs). The pool checks
a connection it hands out without asking the server anything (``_still_connected``).
The write-through's writes and single submits go through a group commit
(``_pg_group``): concurrent callers share one statement and one commit, and each is told
only about its own write. ``save`` is one conditional ``UPDATE``; ``claim_commands``
picks with ``FOR UPDATE SKIP LOCKED`` and leases in the same statement; tags are
``JSONB`` with a GIN index and exact ``@>`` matching; every time is ``TIMESTAMPTZ``.

Schema creation is separate from use: ``create_schema()`` (or ``chongming-task --db DSN
migrate``) needs DDL rights once; the store itself only reads and writes, so a role
without DDL rights can run nodes and the read-only CLI. The schema records its version
(``SCHEMA_VERSION``); a store refuses, when it opens, a schema a newer release made.

Lease decisions use the server's clock (distributed design §15.1): ``storage_now()``
is ``statement_timestamp()``, and the runtime's ``LeaseClock`` passes that time in as
each method's ``now``, so the contract can still be tested with an injected clock.

The driver is optional: without ``pip install "chongming-task[postgres]"`` this module
still imports, and constructing the store raises a ``StoreError`` naming that command.
"""

from __future__ import annotations

import contextlib
import re
import select
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any

from ...errors import ConcurrencyConflict, StoreError, StoreUnavailable, TaskAlreadyExists
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
from ...values import STRICT
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

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout

    from .errors import TRANSIENT, first_line, server_reason, translated
    from .group import GroupCommit, GroupWrite, batch_params, group_statements, settle
    from .listen import Announcer, listen
except ImportError:  # the [postgres] extra is not installed
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

__all__ = ["DEFAULT_SCHEMA", "INSTALL_HINT", "SCHEMA_VERSION", "PostgresTaskStore"]

INSTALL_HINT = 'pip install "chongming-task[postgres]"'
DEFAULT_SCHEMA = "chongming"
SCHEMA_VERSION = 1
"""The version of the tables this release makes and reads (``schema_version``). A schema
made before that table existed holds the tables of version 1."""
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SCHEMA_LOCK_CLASS = 0x63686D74  # "chmt": the first key of chongming-task's advisory locks


def _schema_lock_key(schema: str) -> tuple[int, int]:
    """The advisory lock ``create_schema`` holds for ``schema``: two int4 keys."""
    crc = zlib.crc32(schema.encode())
    return _SCHEMA_LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc


def _schema_ddl(schema: str) -> bytes:
    """schema.sql for ``schema`` (a validated identifier), as one query."""
    ddl = resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
    return ddl.replace("{schema}", schema).replace("{version}", str(SCHEMA_VERSION)).encode()


_SQL = load_named(__package__)
_JSON_COLUMNS = frozenset({"tags", "progress", "failure", "outcome"})
# The task columns as the codec reads them: JSONB as text.
_TASK_SELECT = ", ".join(f"{c}::text" if c in _JSON_COLUMNS else c for c in codec.TASK_COLUMNS)
_SAVE_VALUE_COLUMNS = tuple(c for c in codec.SAVE_COLUMNS if c != "task_id")
_DIALECT = Dialect(
    select=f"SELECT {_TASK_SELECT} FROM tasks",
    placeholder="%s",
    one_of=lambda column, values: (f"{column} = ANY(%s)", [values]),
    prefix=lambda column, text: (f"starts_with({column}, %s)", [text]),
    tag=lambda tag: ("tags @> %s::jsonb", [f"[{encoded_tag(tag)}]"]),
    insertion_order="seq",
    time="%s::timestamptz",
    fence=True,
)


_GROUP_SQL = group_statements(_SQL) if psycopg is not None else {}

_GROUP_LEADERS = 2
"""Group-commit statements in flight at once (each on its own pooled connection)."""

_BULK_FROM = 8
"""Batches from this size are created by one array statement, smaller ones row by row."""

_PROBE_INTERVAL = 0.2
"""Seconds between direct connection attempts while the server is away."""


_ANNOUNCE_EVERY = 0.1
"""Seconds between two notifications of writes, at least."""


def _still_connected(conn: Connection[Any]) -> None:
    """The pool's check of a connection it hands out, without a round trip: an idle
    pooled connection has nothing to read, and a backend that was terminated (or a
    server that went away) has sent its last message or closed the socket, which makes
    it readable. Only then is the server asked (and the connection dropped if it does
    not answer). A connection cut without a word is found by the statement that uses it,
    as it would be a moment after any check."""
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    if _readable(conn.fileno()):
        ConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - Windows


class PostgresTaskStore(NodeRegistrySQL, ScheduleRegistrySQL, PipelineRegistrySQL, TaskScanSQL):
    """A ``TaskStore`` in one PostgreSQL schema (default ``chongming``)."""

    _sql = _SQL
    _dialect = _DIALECT

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        application_name: str = "chongming-task",
        announce_writes: bool = True,
    ) -> None:
        """``announce_writes``: after writes of tasks or transitions, ``NOTIFY`` the
        schema's transitions channel (at most ten times a second, off the write path), so
        a follower such as the dashboard sees them at once; off, followers poll."""
        if psycopg is None:
            raise StoreError(f"PostgresTaskStore needs psycopg 3 and psycopg-pool: {INSTALL_HINT}")
        if not _IDENTIFIER.match(schema):
            raise StoreError(f"schema name {schema!r} must match [a-z_][a-z0-9_]*")
        self.schema = schema
        self._channel = f"chongming_commands_{schema}"  # a validated identifier
        self._transitions_channel = f"chongming_transitions_{schema}"
        self._announcer = (
            Announcer(self._announce, every=_ANNOUNCE_EVERY, name=f"chongming-announce[{schema}]")
            if announce_writes
            else None
        )
        self._dsn = dsn  # for the listener's own connection; never printed (password)
        try:
            info = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise StoreError(f"malformed PostgreSQL DSN: {first_line(exc)}") from None
        self.where = (
            f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
        )
        self._closed = False
        self._local = threading.local()
        self._connect_timeout = connect_timeout
        self._connect_kwargs: dict[str, Any] = {
            "options": f"-c search_path={schema}",
            "application_name": application_name,  # shows in pg_stat_activity
            "connect_timeout": max(1, round(connect_timeout)),
            # A single statement is its own transaction: one round trip, no BEGIN and
            # COMMIT around it. Scopes of several statements open a transaction.
            "autocommit": True,
        }
        self._min_size, self._max_size = min_size, max_size
        self._group = GroupCommit(self._group_apply, leaders=_GROUP_LEADERS)
        self._health = threading.Lock()
        self._down_since: float | None = None  # monotonic time the outage was noticed
        self._stopped = threading.Event()  # set by close(): the prober exits
        # One direct attempt first: a server that answers with a refusal (no such role
        # or database, a wrong password) says so at once, in its own words, instead of
        # the pool retrying it for connect_timeout seconds.
        unreachable = ""
        try:
            psycopg.connect(self._dsn, **self._connect_kwargs).close()
        except psycopg.OperationalError as exc:
            # libpq's connect errors carry no SQLSTATE: "FATAL:" is the server answering.
            if "FATAL:" in str(exc) and not TRANSIENT.search(str(exc)):
                raise StoreError(
                    f"PostgreSQL at {self.where} refused the connection: {server_reason(exc)}"
                ) from None
            unreachable = f": {server_reason(exc)}"
        self._pool = self._new_pool()
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            self._pool.close()
            raise StoreError(
                f"cannot reach PostgreSQL at {self.where} within {connect_timeout:g}s{unreachable}"
            ) from None
        try:
            self._check_version()
        except BaseException:
            self._pool.close()
            raise

    def _check_version(self) -> None:
        """Refuse a schema a newer release made: this one could misread its tables or
        write rows they no longer mean. Checked once, when the store opens (on the
        pool's connection, so a server that was away a moment is checked too)."""
        # An outage here fails the open: nothing to fail fast for, no prober to start.
        with (
            translated("open", self.where, self.schema, lambda: None),
            self._pool.connection() as conn,
        ):
            try:
                row = conn.execute(_SQL["schema_version"]).fetchone()
            except pg_errors.UndefinedTable:
                return  # not made yet (migrate makes it), or made before the table: 1
        if row is not None and row[0] > SCHEMA_VERSION:
            holder = f"chongming-task schema {self.schema!r} at {self.where}"
            raise newer_schema(holder, row[0], SCHEMA_VERSION)

    def _new_pool(self) -> ConnectionPool:
        return ConnectionPool(
            self._dsn,
            min_size=self._min_size,
            max_size=self._max_size,
            kwargs=self._connect_kwargs,
            check=_still_connected,  # a killed backend is replaced, not used
            # During an outage a write fails after this long (the write-through buffers it
            # and catches up later) instead of holding a task for the pool's default 30 s.
            timeout=self._connect_timeout,
            open=False,
            name=f"chongming:{self.where}",
        )

    group_commit = True
    """Writes made side by side share a statement (``_pg_group``)."""

    value_rules = STRICT
    """``TEXT`` and ``JSONB`` refuse NUL (see ``chongming_task.values``)."""

    def __repr__(self) -> str:
        return f"PostgresTaskStore({self.where!r}, schema={self.schema!r})"

    # -- plumbing -----------------------------------------------------------------------------

    # -- outages: fail fast while the server is away, a fresh pool the moment it is back ----

    def _live_pool(self, what: str) -> ConnectionPool:
        """The pool, or ``StoreUnavailable`` at once while an outage is known.

        Without this, every call during an outage waited the pool timeout (a supervisor
        pass waited it once per lagging task), and after the server came back the pool's
        own reconnect back-off (1, 2, 4, 8, 16 s...) kept the store unusable for up to
        16 s more, while leases stayed expired and any reconcile marked live tasks lost.
        """
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        down_since = self._down_since
        if down_since is not None:
            raise StoreUnavailable(
                f"PostgreSQL at {self.where} unreachable during {what} (for "
                f"{time.monotonic() - down_since:.1f}s; reconnecting)"
            )
        return self._pool

    def _went_down(self) -> None:
        """A call found the server unreachable: fail fast from now on, and probe for the
        server's return on a thread of our own (so no caller waits a connect timeout)."""
        with self._health:
            if self._down_since is not None or self._closed:
                return
            self._down_since = time.monotonic()
            threading.Thread(
                target=self._probe, name=f"chongming-pg-probe[{self.where}]", daemon=True
            ).start()

    def _probe(self) -> None:
        """Connect directly every ``_PROBE_INTERVAL`` seconds; once the server answers,
        swap in a fresh pool (the old one's reconnect attempts sit in back-off) and
        declare the store usable again."""
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self._dsn, **self._connect_kwargs) as conn:
                    conn.execute("SELECT 1")
                fresh = self._new_pool()
                try:
                    fresh.open(wait=True, timeout=self._connect_timeout)
                except BaseException:
                    fresh.close()
                    raise
            except Exception:
                self._stopped.wait(_PROBE_INTERVAL)
                continue
            with self._health:
                old, self._pool = self._pool, fresh
                self._down_since = None
                closed = self._closed
            if closed:
                fresh.close()
            # The old pool's workers may sit in a reconnect back-off: close it apart.
            threading.Thread(target=old.close, kwargs={"timeout": 1.0}, daemon=True).start()
            return

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translated(what, self.where, self.schema, self._went_down)

    @contextlib.contextmanager
    def _cursor(
        self, what: str, *, transaction: bool = False, raw: bool = False
    ) -> Iterator[Cursor[Any]]:
        """A cursor on a pooled connection, or inside ``atomic()`` on its connection.
        Each statement commits on its own (the pool is in autocommit) unless
        ``transaction``: then the scope is one transaction, rolled back on error. A
        ``raw`` cursor takes statements with ``$1`` placeholders, passed as they are."""
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        cursor = psycopg.RawCursor if raw else psycopg.Cursor
        bound: Connection[Any] | None = getattr(self._local, "conn", None)
        if bound is not None:  # inside atomic(): the caller's transaction
            with self._errors(what), cursor(bound) as cur:
                yield cur
            return
        pool = self._live_pool(what)
        with self._errors(what), pool.connection() as conn:
            if not transaction:
                with cursor(conn) as cur:
                    yield cur
                return
            with conn.transaction(), cursor(conn) as cur:
                yield cur

    def _sql_scope(
        self, what: str, *, write: bool
    ) -> contextlib.AbstractContextManager[Cursor[Any]]:
        return self._cursor(what, transaction=write)

    def _node_time(self, given: datetime) -> datetime:
        return self.storage_now()  # one clock for every node's liveness

    def storage_now(self) -> datetime:
        """Optional capability (``SupportsStorageClock``): the server's clock."""
        with self._cursor("storage_now") as cur:
            row = cur.execute(_SQL["storage_now"]).fetchone()
        if row is None:  # pragma: no cover - SELECT of a function returns one row
            raise StoreError("PostgreSQL returned no time")
        return utc(row[0], "storage_now()")

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Optional capability (not part of ``TaskStore``): calls made inside, on this
        thread, run in one transaction."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        pool = self._live_pool("atomic")
        with self._errors("atomic"), pool.connection() as conn, conn.transaction():
            self._local.conn = conn
            self._local.wrote = False
            try:
                yield
            finally:
                self._local.conn = None
        if self._local.wrote and self._announcer is not None:  # committed
            self._announcer.wrote()

    def _wrote(self) -> None:
        """Tasks or transitions were written: followers are told once it is committed
        (at the end of ``atomic()`` inside one)."""
        if self._announcer is None:
            return
        if getattr(self._local, "conn", None) is not None:
            self._local.wrote = True
        else:
            self._announcer.wrote()

    def _announce(self) -> None:
        with self._cursor("notify") as cur:
            cur.execute(_SQL["notify"], [self._transitions_channel])

    def create_schema(self) -> None:
        """Create the schema, tables and indexes if absent (needs DDL rights; idempotent).

        Nodes that each call this at start may run it together: each waits for the
        others' DDL first, on a lock of this schema's (``IF NOT EXISTS`` alone does not
        hold against a creation not yet committed: the later one failed on a duplicate
        key of the system catalog)."""
        with self._cursor("create_schema", transaction=True) as cur:
            cur.execute(_SQL["ddl_lock"], _schema_lock_key(self.schema))
            cur.execute(_schema_ddl(self.schema))

    @staticmethod
    def _snapshot(row: Sequence[Any]) -> TaskSnapshot:
        return codec.values_to_snapshot(row)

    # -- task snapshots -------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        values = codec.snapshot_to_values(snapshot)
        with self._cursor("create") as cur:
            cur.execute(_SQL["insert_task"], values)
            inserted = cur.rowcount
        if inserted != 1:
            raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
        self._wrote()

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """Optional capability (``SupportsCreateMany``): every task and its creation
        transition in one transaction, all or nothing. One task (a ``submit``) goes
        through the group commit, sharing a statement with concurrent writes; a few are
        plain inserts in one transaction; from ``_BULK_FROM`` a batch is one statement,
        one array per column (the group commit's JSON rows measured 12-14k tasks/s in
        batches of 1,000 against 20-22k for the arrays)."""
        if not items:
            return
        if len(items) == 1:  # a submit: committed with other threads' writes
            snapshot, created = items[0]
            self._group_write(GroupWrite(snapshot.task_id, [created], new=snapshot))
            return
        if len(items) < _BULK_FROM:
            with self.atomic():  # create and append run on its connection
                for snapshot, created in items:
                    self.create(snapshot)
                    self.append(created)
            return
        tasks = [codec.snapshot_to_values(s) for s, _ in items]
        trail = [codec.transition_to_values(t) for _, t in items]
        params = [list(column) for column in zip(*tasks, strict=True)]
        params += [list(column) for column in zip(*trail, strict=True)]
        with self.atomic(), self._cursor("create_many") as cur:
            row = cur.execute(_SQL["create_many"], params).fetchone()
            if row is None or row[0] != len(items):
                # Raised inside atomic(): the transaction rolls back, nothing is kept.
                raise TaskAlreadyExists(f"a task id among {len(items)} already exists")
            self._wrote()

    def write_transitions(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition],
    ) -> None:
        """Optional capability (``SupportsWriteTransitions``), used by the write-through:
        compare-and-set the columns a task's life changes (the identity columns are
        fixed at create) and append ``transitions`` where it won, in one statement.
        Raises ``ConcurrencyConflict`` like ``save``, with nothing written.

        Committed by group commit (``_pg_group``): it returns once committed, possibly
        in the same statement as other threads' writes."""
        self._group_write(
            GroupWrite(snapshot.task_id, transitions, life=snapshot, expect=expect_version)
        )

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """Optional capability (``SupportsWriteTogether``): ``write_transitions`` for each
        of ``writes``, queued to the group commit together (usually one statement); each
        compare-and-set stands alone. Returns each write's error, ``None`` where it
        landed."""
        group = [
            GroupWrite(snapshot.task_id, transitions, life=snapshot, expect=expect)
            for snapshot, expect, transitions in writes
        ]
        self._group_write_all(group)
        return [write.error for write in group]

    def _group_write(self, write: GroupWrite) -> None:
        """Commit ``write`` (``_group_write_all``); raise its error."""
        self._group_write_all((write,))
        if write.error is not None:
            raise write.error

    def _group_write_all(self, writes: Sequence[GroupWrite]) -> None:
        """Commit ``writes``, each on its own, leaving each one's error on it: inside
        ``atomic()`` as one statement on its connection (never others' writes in the
        caller's transaction), else through the group commit."""
        if getattr(self._local, "conn", None) is None:
            self._group.run(writes)
            return
        try:
            self._group_apply(writes)
        except Exception as exc:  # the statement failed: nothing of it was written
            for write in writes:
                write.error = exc

    def _group_apply(self, writes: Sequence[GroupWrite]) -> None:
        """One group statement (``group_statements``) for ``writes``; each write's
        outcome is set on it. Raises (nothing written) if the statement fails as a
        whole."""
        which, params = batch_params(writes)
        with self._cursor("write", raw=True) as cur:
            returned = cur.execute(_GROUP_SQL[which], params).fetchall()
        settle(writes, returned)
        if any(write.error is None for write in writes):
            self._wrote()

    def mark_lost(self, marks: Sequence[tuple[TaskSnapshot, Transition]]) -> set[str]:
        """Optional capability (``SupportsMarkLost``), used by ``reconcile()``: each
        task its own compare-and-set from ``transition.version - 1``, its trail row
        appended only where that won; all in one statement. Returns the ids marked."""
        if not marks:
            return set()
        once = codec.encoded_once()
        rows = [
            (
                m.task_id,
                t.version,
                once(m.ended_at, codec.encode_dt),
                once(m.failure, codec.encode_failure),
                t.from_status.value if t.from_status else None,
                once(t.at, codec.encode_dt),
                t.reason,
                t.actor,
            )
            for m, t in marks
        ]
        columns = [list(column) for column in zip(*rows, strict=True)]
        with self._cursor("mark_lost") as cur:
            marked = {task_id for (task_id,) in cur.execute(_SQL["mark_lost"], columns).fetchall()}
        self._wrote()
        return marked

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
        statement (the judgement, each task's compare-and-set and its trail row)."""
        with self.atomic(), self._cursor("mark_expired_lost") as cur:
            (where, where_params), verdicts = verdicts_of_expired(
                cur, scan, _DIALECT, _SQL["expired_owners"], verdict
            )
            if not verdicts:
                return []
            when = codec.encode_dt(at)
            params = [
                *(list(column) for column in zip(*verdicts, strict=True)),
                *where_params,
                sorted(exclude),
                when,
                when,
                actor,
            ]
            sql = _SQL["mark_expired_lost"].replace("{scan}", where)
            marked = [task_id for (task_id,) in cur.execute(sql, params).fetchall()]
            self._wrote()
            return marked

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = codec.snapshot_to_row(snapshot)
        params = [row[c] for c in _SAVE_VALUE_COLUMNS] + [snapshot.task_id, expect_version]
        with self._cursor("save") as cur:
            cur.execute(_SQL["save_task"], params)
            saved = cur.rowcount == 1
            if not saved:
                cur.execute(_SQL["stored_version"], [snapshot.task_id])
                found = cur.fetchone()
        if saved:
            self._wrote()
            return
        raise ConcurrencyConflict.version_mismatch(
            snapshot.task_id, expect_version, None if found is None else found[0]
        )

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._cursor("get") as cur:
            cur.execute(_SQL["get_task"], [task_id])
            row = cur.fetchone()
        return None if row is None else self._snapshot(row)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        sql, params = query_sql(query or TaskQuery(), _DIALECT)
        with self._cursor("query") as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        return [self._snapshot(r) for r in rows]

    def explain_query(self, query: TaskQuery | None = None) -> list[str]:
        sql, params = query_sql(query or TaskQuery(), _DIALECT)
        with self._cursor("explain") as cur:
            cur.execute("EXPLAIN " + sql, params)
            return [r[0] for r in cur.fetchall()]

    def counts(self) -> dict[TaskStatus, int]:
        with self._cursor("counts") as cur:
            cur.execute(_SQL["counts"])
            rows = cur.fetchall()
        return {TaskStatus(status): n for status, n in rows}

    # -- audit trail ------------------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        values = codec.transition_to_values(transition)
        with self._cursor("append") as cur:
            cur.execute(_SQL["append"], values)
        self._wrote()

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._cursor("history") as cur:
            cur.execute(_SQL["history"], [task_id, since_version])
            rows = cur.fetchall()
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
        with self._cursor("touch") as cur:
            cur.execute(_SQL["touch_task"], params)

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> None:
        """Optional capability (``SupportsRenewLeases``): every lease in one statement
        (a supervisor pass renewing a hundred leases was a hundred round trips)."""
        if not task_ids:
            return
        with self._cursor("renew_leases") as cur:
            cur.execute(
                _SQL["renew_leases"], [owner, codec.encode_dt(utc(until, "until")), list(task_ids)]
            )

    # -- commands ---------------------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        values = codec.command_to_values(command)
        try:
            # One transaction: a command is stored and announced, or neither.
            with self._cursor("submit_command", transaction=True) as cur:
                cur.execute(_SQL["insert_command"], values)
                # Delivered at commit, to listeners only: a wake-up, never the delivery.
                cur.execute(f"NOTIFY {self._channel}".encode())
        except StoreError as exc:
            if isinstance(exc.__cause__, pg_errors.UniqueViolation):
                raise StoreError(f"command {command.command_id} already exists") from None
            raise

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        now = utc(now, "now")
        until = now + timedelta(seconds=lease_seconds)
        with self._cursor("claim_commands") as cur:
            cur.execute(
                _SQL["claim_commands"], [codec.encode_dt(now), limit, codec.encode_dt(until)]
            )
            rows = cur.fetchall()
        rows.sort(key=lambda r: (r[5], r[0]))  # created_at, then insertion order
        return [codec.values_to_command(r[1:]) for r in rows]

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """Optional capability (``SupportsCommandLog``)."""
        with self._cursor("finished_commands") as cur:
            cur.execute(_SQL["finished_commands"], [codec.encode_dt(utc(after, "after")), limit])
            rows = cur.fetchall()
        return [codec.values_to_command(r) for r in rows]

    def subscribe_commands(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Optional capability (``SupportsCommandWakeups``): call ``wake()`` soon after
        any process submits a command, so a poller can claim it before its next interval.
        Polling stays the source of truth (distributed design §17 point 4). Returns a
        function that stops it."""
        return listen(self._dsn, self._channel, wake, name=f"chongming-listen[{self.where}]")

    def subscribe_transitions(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Optional capability (``SupportsTransitionWakeups``): call ``wake()`` soon after
        any process writes tasks or transitions through a store that announces its
        writes (``announce_writes``, the default). Returns a function that stops it."""
        return listen(
            self._dsn, self._transitions_channel, wake, name=f"chongming-follow[{self.where}]"
        )

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._cursor("complete_command") as cur:
            cur.execute(_SQL["complete_command"], [codec.encode_dt(now), outcome, command_id])

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._cursor("release_command") as cur:
            cur.execute(_SQL["release_command"], [command_id])

    # -- operations -------------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        if keep_terminal < 0:
            raise ValueError(f"keep_terminal must be >= 0, got {keep_terminal}")
        with self._cursor("prune") as cur:
            cur.execute(_SQL["prune"], [keep_terminal])
            return cur.rowcount

    def close(self) -> None:
        """Close the pool (its connections are really closed). Idempotent; any later call
        raises ``StoreError``."""
        with self._health:
            if self._closed:
                return
            self._closed = True
            self._stopped.set()
            pool = self._pool
        if self._announcer is not None:
            self._announcer.close()
        pool.close()
