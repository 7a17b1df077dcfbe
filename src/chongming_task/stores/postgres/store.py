"""``PostgresTaskStore``: one store shared by nodes on different machines.

psycopg 3 with a real connection pool shared by the controller's threads, in
autocommit: a method of one statement is one round trip, and every method is one short
transaction (no transaction or row lock is ever held while a task runs). The pool checks
a connection it hands out without asking the server anything (``pool``). The
write-through's writes and single submits go through a group commit (``group``):
concurrent callers share one statement and one commit, and each is told only about its
own write. ``save`` is one conditional ``UPDATE``; ``claim_commands`` picks with ``FOR
UPDATE SKIP LOCKED`` and leases in the same statement; tags are ``JSONB`` with a GIN index
and exact ``@>`` matching; every time is ``TIMESTAMPTZ``.

Schema creation is separate from use: ``create_schema()`` (or ``chongming-task --db DSN
migrate``) needs DDL rights once; the store itself only reads and writes, so a role
without DDL rights can run nodes and the read-only CLI. The schema records its version
(``SCHEMA_VERSION``); a store refuses, when it opens, a schema a newer release made.

Lease decisions use the server's clock (docs/design.md, "Clocks"): ``storage_now()`` is
``statement_timestamp()``, passed in by the runtime's ``LeaseClock`` as each method's
``now`` (the contract can still be tested with an injected clock).

Without the driver (``pip install "chongming-task[postgres]"``) this module imports, and
constructing the store raises a ``StoreError`` naming that command."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ...model import (
    Command,
    Progress,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    Transition,
    utc,
)
from ...values import STRICT
from .. import codec
from ..capabilities import Verdict
from ..roles import LifeWrite
from ..sql import load_named, query_sql, verdicts_of_expired
from ..sql_store import SqlStore
from .schema import (
    SCHEMA_VERSION,
    check_schema_name,
    dialect_in,
    older_schema_on,
    schema_ddl,
    schema_lock_key,
    statements_in,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool

    from .errors import translated
    from .group import (
        Behind,
        GroupCommit,
        GroupWrite,
        batch_params,
        group_statements,
        settle,
    )
    from .listen import Announcer, Subscriptions
    from .pool import ServerPool
except ImportError:  # the [postgres] extra is not installed
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

__all__ = ["DEFAULT_SCHEMA", "INSTALL_HINT", "SCHEMA_VERSION", "PostgresTaskStore"]

INSTALL_HINT = 'pip install "chongming-task[postgres]"'
DEFAULT_SCHEMA = "chongming"

_SQL = load_named(__package__)
"""The named statements, their tables written ``{schema}.name`` (``statements_in``)."""
_SAVE_VALUE_COLUMNS = tuple(c for c in codec.SAVE_COLUMNS if c != "task_id")


_GROUP_LEADERS = 2
"""Group-commit statements in flight at once (each on its own pooled connection)."""

_BULK_FROM = 8
"""Batches from this size are created by one array statement, smaller ones row by row."""

_ANNOUNCE_EVERY = 0.1
"""Seconds between two notifications of writes, at least."""


class PostgresTaskStore(SqlStore):
    """A ``TaskStore`` in one PostgreSQL schema (default ``chongming``)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = 3,
        connect_timeout: float = 5.0,
        application_name: str = "chongming-task",
        announce_writes: bool = True,
        wait_for_server: bool = True,
        pooled: bool = False,
        listen_dsn: str | None = None,
        prepare: bool | None = None,
    ) -> None:
        """A store on the server ``dsn`` names (``postgresql://user@host:5432/db``,
        or libpq's ``key=value`` form), in the schema ``schema`` (made by ``migrate``;
        every statement names it). ``application_name``: how the connections show in
        ``pg_stat_activity``.

        Connections: the pool's (``min_size`` to ``max_size``; beyond ``min_size``
        closed after 30 s unused) and one per subscription (a node's ``LISTEN``), so a
        node holds 4 at most by default, 2 while idle. ``announce_writes``: after writes
        of tasks or transitions, ``NOTIFY`` the schema's transitions channel (at most ten
        a second, off the write path), so a follower such as the dashboard sees them at
        once; off, followers poll.
        ``wait_for_server=False``: nothing listening is an error at once (a command line),
        not waited for up to ``connect_timeout`` (a node started beside its server).
        ``pooled``: the DSN reaches the server through a pooler in transaction mode
        (PgBouncer), so no prepared statements (``prepare=True`` where the pooler carries
        them: PgBouncer 1.21+ with ``max_prepared_statements``) and no ``LISTEN`` but
        through ``listen_dsn``, a direct DSN (without one, nodes poll commands often).
        ``prepare``: whether statements are prepared server-side (``None``: unless
        ``pooled``)."""
        if psycopg is None:
            raise StoreError(f"PostgresTaskStore needs psycopg 3 and psycopg-pool: {INSTALL_HINT}")
        self.schema = check_schema_name(schema)
        # No session state (no search_path), so a pooler in transaction mode can carry
        # the connections: every statement names its schema.
        super().__init__(
            statements=statements_in(_SQL, schema),
            dialect=dialect_in(schema),
            scope=lambda what, *, write: self._cursor(what, transaction=write),
        )
        self._group_sql = group_statements(self._sql)
        self._announcer = (
            Announcer(self._announce, every=_ANNOUNCE_EVERY, name=f"chongming-announce[{schema}]")
            if announce_writes
            else None
        )
        self._local = threading.local()
        self.group = GroupCommit(self._group_apply, leaders=_GROUP_LEADERS)
        """The group commit of this store's writes (for benches and tools: how well
        writes are grouped)."""
        self._server = ServerPool(
            dsn,
            schema=schema,
            min_size=min_size,
            max_size=max_size,
            connect_timeout=connect_timeout,
            application_name=application_name,
            wait_for_server=wait_for_server,
            prepare=not pooled if prepare is None else prepare,
        )
        self.where = self._server.where
        listens_on = listen_dsn or (None if pooled else dsn)
        self._listening = Subscriptions(
            listens_on, application_name, where=self.where, schema=schema
        )
        self._older: StoreError | None = None  # an older release's schema: until migrated
        try:
            self._check_version()
        except BaseException:
            self._server.close(before=lambda: None)
            raise

    def _check_version(self) -> None:
        """Checked once, when the store opens, on the pool's connection (a server that
        was away a moment is checked too); an outage here fails the open."""
        holder = f"chongming-task schema {self.schema!r} at {self.where}"
        with (
            translated("open", self.where, self.schema, lambda: None),
            self._server.opening().connection() as conn,
        ):
            self._older = older_schema_on(conn, self._sql, holder)

    group_commit = True
    """Writes made side by side share a statement (``group.GroupCommit``)."""

    value_rules = STRICT
    """``TEXT`` and ``JSONB`` refuse NUL (see ``chongming_task.values``)."""

    def __repr__(self) -> str:
        return f"PostgresTaskStore({self.where!r}, schema={self.schema!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return self._server.errors(what)

    def _live_pool(self, what: str) -> ConnectionPool:
        """The pool, or at once ``StoreUnavailable`` during an outage (``ServerPool``);
        a schema an older release made is refused until it is migrated."""
        if self._older is not None and what != "create_schema":
            raise self._older
        return self._server.live(what, f"{self!r} is closed")

    @contextlib.contextmanager
    def _cursor(
        self, what: str, *, transaction: bool = False, raw: bool = False
    ) -> Iterator[Cursor[Any]]:
        """A cursor on a pooled connection, or inside ``atomic()`` on its connection.
        Each statement commits on its own (the pool is in autocommit) unless
        ``transaction``: then the scope is one transaction, rolled back on error. A
        ``raw`` cursor takes statements with ``$1`` placeholders, passed as they are."""
        if self._server.closed:
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

    def storage_now(self) -> datetime:
        """``SupportsStorageClock``: the server's clock."""
        with self._cursor("storage_now") as cur:
            row = cur.execute(self._sql["storage_now"]).fetchone()
        if row is None:  # pragma: no cover - SELECT of a function returns one row
            raise StoreError("PostgreSQL returned no time")
        return utc(row[0], "storage_now()")

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """``SupportsAtomic``: calls made inside, on this
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
            cur.execute(self._sql["notify"], [self._listening.transitions])

    def create_schema(self) -> None:
        """Create the schema, tables and indexes if absent (needs DDL rights; idempotent).

        Nodes that each call this at start may run it together: each waits for the
        others' DDL first, on a lock of this schema's (``IF NOT EXISTS`` alone does not
        hold against a creation not yet committed: the later one failed on a duplicate
        key of the system catalog)."""
        with self._cursor("create_schema", transaction=True) as cur:
            cur.execute(self._sql["ddl_lock"], schema_lock_key(self.schema))
            cur.execute(schema_ddl(self.schema))
        self._older = None

    # -- task snapshots -------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        values = codec.snapshot_to_values(snapshot)
        with self._cursor("create") as cur:
            cur.execute(self._sql["insert_task"], values)
            inserted = cur.rowcount
        if inserted != 1:
            raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
        self._wrote()

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """``BatchedWrites``: every task and its creation
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
            row = cur.execute(self._sql["create_many"], params).fetchone()
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
        """``BatchedWrites``, used by the write-through:
        compare-and-set the columns a task's life changes (the identity columns are
        fixed at create) and append ``transitions`` where it won, in one statement.
        Raises ``ConcurrencyConflict`` like ``save``, with nothing written.

        Committed by group commit (``_pg_group``): it returns once committed, possibly
        in the same statement as other threads' writes."""
        self._group_write(
            GroupWrite(snapshot.task_id, transitions, life=snapshot, expect=expect_version)
        )

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """``BatchedWrites``: ``write_transitions`` for each
        of ``writes``, queued to the group commit together (usually one statement); each
        compare-and-set stands alone. Returns each write's error, ``None`` where it
        landed."""
        group = [
            GroupWrite(snapshot.task_id, transitions, life=snapshot, expect=expect)
            for snapshot, expect, transitions in writes
        ]
        self._group_write_all(group)
        return [write.error for write in group]

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Behind:
        """``BatchedWrites``: ``write_transitions_together``,
        queued to the group commit and not waited for. The writes ride the next
        statement anyone leads (a ``submit``'s, say), or ``serve()`` (when no statement
        is in flight) / ``wait()`` on what is returned commits them; inside
        ``atomic()`` they are written at once."""
        group = [
            GroupWrite(snapshot.task_id, transitions, life=snapshot, expect=expect)
            for snapshot, expect, transitions in writes
        ]
        if getattr(self._local, "conn", None) is None:
            return self.group.behind(group)
        self._group_write_all(group)  # on the caller's transaction: here, now
        for write in group:
            write.settled = True
        return Behind(self.group, group, time.monotonic())

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
            self.group.run(writes)
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
            returned = cur.execute(self._group_sql[which], params).fetchall()
        settle(writes, returned)
        if any(write.error is None for write in writes):
            self._wrote()

    def mark_lost(self, marks: Sequence[tuple[TaskSnapshot, Transition]]) -> set[str]:
        """``BatchedWrites``, used by ``reconcile()``: each
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
            marked = {
                task_id for (task_id,) in cur.execute(self._sql["mark_lost"], columns).fetchall()
            }
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
        """``Maintenance``: ``reconcile()`` in one
        statement (the judgement, each task's compare-and-set and its trail row)."""
        with self.atomic(), self._cursor("mark_expired_lost") as cur:
            (where, where_params), verdicts = verdicts_of_expired(
                cur, scan, self._dialect, self._sql["expired_owners"], verdict
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
            sql = self._sql["mark_expired_lost"].replace("{scan}", where)
            marked = [task_id for (task_id,) in cur.execute(sql, params).fetchall()]
            self._wrote()
            return marked

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = codec.snapshot_to_row(snapshot)
        params = [row[c] for c in _SAVE_VALUE_COLUMNS] + [snapshot.task_id, expect_version]
        with self._cursor("save") as cur:
            cur.execute(self._sql["save_task"], params)
            saved = cur.rowcount == 1
            if not saved:
                cur.execute(self._sql["stored_version"], [snapshot.task_id])
                found = cur.fetchone()
        if saved:
            self._wrote()
            return
        raise ConcurrencyConflict.version_mismatch(
            snapshot.task_id, expect_version, None if found is None else found[0]
        )

    def explain_query(self, query: TaskQuery | None = None) -> list[str]:
        sql, params = query_sql(query or TaskQuery(), self._dialect)
        with self._cursor("explain") as cur:
            cur.execute("EXPLAIN " + sql, params)
            return [r[0] for r in cur.fetchall()]

    def append(self, transition: Transition) -> None:
        values = codec.transition_to_values(transition)
        with self._cursor("append") as cur:
            cur.execute(self._sql["append"], values)
        self._wrote()

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
            cur.execute(self._sql["touch_task"], params)

    # -- commands ---------------------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        holder = [self._listening.commands, command.task_id]  # told to the task's holder
        try:  # one transaction: a command is stored and announced (at commit), or neither
            with self._cursor("submit_command", transaction=True) as cur:
                cur.execute(self._sql["insert_command"], codec.command_to_values(command))
                cur.execute(self._sql["notify_command"], holder)  # a wake-up, not the delivery
        except StoreError as exc:
            if isinstance(exc.__cause__, pg_errors.UniqueViolation):
                raise StoreError(f"command {command.command_id} already exists") from None
            raise

    def connections(self) -> int:
        """Server connections this store holds now: its pool's, and one a subscription
        (``LISTEN``)."""
        return self._server.size() + len(self._listening)

    def subscribe_commands(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """``CommandChannel``: ``wake()`` soon after any
        process submits a command; polling stays the truth (docs/design.md, "Commands")."""
        return self._listening.to_commands(wake)

    def subscribe_commands_for(
        self, holder: str, wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        """``CommandChannel``: for ``holder``'s commands."""
        return self._listening.to_commands(wake, holder=holder)

    def subscribe_transitions(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """``CommandChannel``: ``wake()`` soon after any
        process writes tasks or transitions through a store that announces its writes."""
        return self._listening.to_transitions(wake)

    def prune(self, *, keep_terminal: int) -> int:
        if keep_terminal < 0:
            raise ValueError(f"keep_terminal must be >= 0, got {keep_terminal}")
        with self._cursor("prune") as cur:
            cur.execute(self._sql["prune"], [keep_terminal])
            pruned = cur.rowcount
            if pruned:
                cur.execute(self._sql["prune_orphan_pipelines"])
            return pruned

    def close(self) -> None:
        """Close the pool (its connections are really closed). Idempotent; any later call
        raises ``StoreError``."""
        announcer = self._announcer
        self._server.close(before=announcer.close if announcer is not None else lambda: None)
