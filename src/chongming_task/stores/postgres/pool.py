"""The Postgres store's connections: one psycopg pool in autocommit, a check of each
connection it hands out that asks the server nothing, and the store's behaviour during
an outage (fail at once, probe on a thread of its own, a fresh pool the moment the
server is back). Imported only with the driver installed."""

from __future__ import annotations

import contextlib
import logging
import re
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import StoreError, StoreUnavailable
from ...loops import Pass, keep_running
from ..dsn import where_of
from .errors import first_line, refusal, server_reason, translated

__all__ = ["ServerPool"]

_PROBE_INTERVAL = 0.2
"""Seconds between direct connection attempts while the server is away."""
_MAX_IDLE = 30.0
"""Seconds a pooled connection beyond ``min_size`` may sit unused before the pool closes
it (one every such spell): a node that was busy gives its connections back to the
server within a minute or two of going idle."""


_POOL_NAME = "chongming:"
"""How this store's pools are named (``psycopg_pool``'s log lines name the pool)."""


class _OneLine(logging.Filter):
    """psycopg_pool's log lines about this store's pools, each on one line. A failed
    connect's libpq message spans two ("... Connection refused", then "Is the server
    running on that host ..."), and during an outage the pool says it every few
    seconds. The lines about other pools are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            isinstance(a, str) and a.startswith(_POOL_NAME) for a in args
        ):
            record.args = tuple(first_line(a) if isinstance(a, BaseException) else a for a in args)
        return True


_ONE_LINE = _OneLine()


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


class ServerPool:
    """A pool of connections to one server and schema, and what happens while the
    server is away."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        min_size: int,
        max_size: int,
        connect_timeout: float,
        application_name: str,
        wait_for_server: bool = True,
        prepare: bool = True,
    ) -> None:
        """Opens the pool, waiting up to ``connect_timeout`` for a server that is away
        (with ``wait_for_server``; else nothing listening is an error at once);
        ``StoreError`` if the server refuses, or cannot be reached by then."""
        self.dsn = dsn
        """For connections of their own (the listener's); never printed (password)."""
        try:
            info = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            # libpq quotes the fragment it stumbled on, which may be a password.
            quoted = re.sub(r'"[^"]*"', '"..."', first_line(exc))
            raise StoreError(f"malformed PostgreSQL DSN: {quoted}") from None
        self.where = where_of({"port": "5432", **{k: str(v) for k, v in info.items() if v}})
        self.schema = schema
        self.closed = False
        self.connect_kwargs: dict[str, Any] = {
            "application_name": application_name,  # shows in pg_stat_activity
            "connect_timeout": max(1, round(connect_timeout)),
            # A single statement is its own transaction: one round trip, no BEGIN and
            # COMMIT around it. Scopes of several statements open a transaction.
            "autocommit": True,
            # None: never prepared (a transaction pooler hands each transaction to any
            # server connection, where a statement prepared on another is unknown).
            "prepare_threshold": 5 if prepare else None,
        }
        self._timeout = connect_timeout
        self._sizes = min_size, max_size
        self._health = threading.Lock()
        self._down_since: float | None = None  # monotonic time the outage was noticed
        self._stopped = threading.Event()  # set by close(): the prober exits
        # One direct attempt first: a server that answers with a refusal (no such role
        # or database, a wrong password) says so at once, in its own words, instead of
        # the pool retrying it for connect_timeout seconds.
        unreachable = ""
        try:
            psycopg.connect(dsn, **self.connect_kwargs).close()
        except psycopg.OperationalError as exc:
            # libpq's connect errors carry no SQLSTATE: their text says what went wrong.
            why = refusal(exc, away_passes=wait_for_server)
            if why is not None:
                raise StoreError(f"PostgreSQL at {self.where}: {why}") from None
            unreachable = f": {server_reason(exc)}"
        logging.getLogger("psycopg.pool").addFilter(_ONE_LINE)  # once: it is the same filter
        self._pool = self._new_pool()
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            self._pool.close()
            raise StoreError(
                f"cannot reach PostgreSQL at {self.where} within {connect_timeout:g}s{unreachable}"
            ) from None

    def _new_pool(self) -> ConnectionPool:
        min_size, max_size = self._sizes
        return ConnectionPool(
            self.dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=self.connect_kwargs,
            check=_still_connected,  # a killed backend is replaced, not used
            # During an outage a write fails after this long (the write-through buffers it
            # and catches up later) instead of holding a task for the pool's default 30 s.
            timeout=self._timeout,
            max_idle=_MAX_IDLE,
            # One maintenance worker: it opens, replaces and closes the pool's few
            # connections (max_size 3 by default), where psycopg_pool's default of three
            # kept two threads idle in every store: 17 threads a node became 15.
            num_workers=1,
            open=False,
            name=f"{_POOL_NAME}{self.where}",
        )

    def size(self) -> int:
        """Connections the pool holds now (in use or idle)."""
        return int(self._pool.get_stats().get("pool_size", 0))

    def errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The driver's errors raised inside, as the store's; an outage noticed."""
        return translated(what, self.where, self.schema, self._went_down)

    def live(self, what: str, closed_message: str) -> ConnectionPool:
        """The pool, or ``StoreUnavailable`` at once while an outage is known.

        Without this, every call during an outage waited the pool timeout (a supervisor
        pass waited it once per lagging task), and after the server came back the pool's
        own reconnect back-off (1, 2, 4, 8, 16 s...) kept the store unusable for up to
        16 s more, while leases stayed expired and any reconcile marked live tasks lost.
        """
        if self.closed:
            raise StoreError(closed_message)
        down_since = self._down_since
        if down_since is not None:
            raise StoreUnavailable(
                f"PostgreSQL at {self.where} unreachable during {what} (for "
                f"{time.monotonic() - down_since:.1f}s; reconnecting)"
            )
        return self._pool

    def opening(self) -> ConnectionPool:
        """The pool while the store opens (an outage then fails the open: no prober)."""
        return self._pool

    def _went_down(self) -> None:
        """A call found the server unreachable: fail fast from now on, and probe for the
        server's return on a thread of our own (so no caller waits a connect timeout)."""
        with self._health:
            if self._down_since is not None or self.closed:
                return
            self._down_since = time.monotonic()
            name = f"chongming-pg-probe[{self.where}]"
            target = keep_running(name, self._probe, stopping=self._stopped.is_set)
            threading.Thread(target=target, name=name, daemon=True).start()

    def _probe(self) -> None:
        """Connect directly every ``_PROBE_INTERVAL`` seconds until the server answers
        (``run_once``)."""
        while not self._stopped.is_set():
            try:
                if self.run_once().done:
                    return
            except Exception:
                pass  # still away
            self._stopped.wait(_PROBE_INTERVAL)

    def run_once(self, now: float | None = None) -> Pass:
        """One probe of a server that was away: if it answers, swap in a fresh pool (the
        old one's reconnect attempts sit in back-off) and declare the store usable again
        (``done``: 1). Raises what the attempt raised while it is still away."""
        if self._down_since is None:
            return Pass()
        with psycopg.connect(self.dsn, **self.connect_kwargs) as conn:
            conn.execute("SELECT 1")
        fresh = self._new_pool()
        try:
            fresh.open(wait=True, timeout=self._timeout)
        except BaseException:
            fresh.close()
            raise
        with self._health:
            old, self._pool = self._pool, fresh
            self._down_since = None
            closed = self.closed
        if closed:
            fresh.close()
        # The old pool's workers may sit in a reconnect back-off: close it apart.
        threading.Thread(target=old.close, kwargs={"timeout": 1.0}, daemon=True).start()
        return Pass(done=1)

    def close(self, before: Callable[[], None]) -> None:
        """Refuse every later call, run ``before`` (the pool still open for whatever it
        finishes), then close the pool: its connections really closed. Idempotent."""
        with self._health:
            if self.closed:
                return
            self.closed = True
            self._stopped.set()
        before()
        self._pool.close()
