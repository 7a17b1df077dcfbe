"""The SQLite store's one connection, the lock that guards it, and the two scopes every
store call runs in: a read (or one statement) under the lock, and a write transaction
(``BEGIN IMMEDIATE ... COMMIT``). Both check the connection is open, word the driver's
errors as the store's, and serve the group commit's queue on release."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from ...errors import StoreError

if TYPE_CHECKING:
    from .group import GroupCommit

__all__ = ["ReadScope", "SqliteConnection", "WriteScope"]


def _nothing() -> None:
    return None


class SqliteConnection:
    """One connection (``check_same_thread=False``) shared by a store's threads under
    its own re-entrant lock (store methods run inside ``atomic()``)."""

    def __init__(self, path: str, *, timeout: float) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.depth = 0
        """> 0 while a write scope (or ``atomic()``) holds the transaction."""
        self.holder: int | None = None
        """The thread whose write scope holds the transaction."""
        self.closed = False
        self.group: GroupCommit | None = None
        """The store's group commit, whose queue a scope serves as it lets go."""
        self.committed: Callable[[], None] = _nothing
        """Called after each commit (the Checkpointer counts them)."""
        try:
            self.conn = sqlite3.connect(
                path,
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
                # Room for the group commit's batched statements (one per row count).
                cached_statements=512,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite database {path}: {exc}") from exc

    def read(self, what: str) -> ReadScope:
        """``with connection.read(what) as conn``: the connection, under the lock."""
        return ReadScope(self, what)

    def write(self, what: str) -> WriteScope:
        """A write (or a read that decides a write) atomically and durably: one ``BEGIN
        IMMEDIATE ... COMMIT`` under the lock, so a read that decides a write (claims,
        prune) is atomic against other processes too. Inside ``atomic()`` a write joins
        the caller's transaction."""
        return WriteScope(self, what)

    def scope(self, what: str, *, write: bool) -> ReadScope | WriteScope:
        """``write`` or ``read``: the scope ``SqlStore`` runs its statements in."""
        return WriteScope(self, what) if write else ReadScope(self, what)

    def in_transaction(self) -> bool:
        """Whether the lock's holder is inside a write scope (``atomic()``)."""
        return self.depth > 0

    def held_here(self) -> bool:
        """Whether this thread holds the transaction (it is inside ``atomic()``)."""
        return self.holder == threading.get_ident()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """The driver's errors raised inside, as the store's ``StoreError``."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise self.translate(exc, what) from exc

    def translate(self, exc: sqlite3.DatabaseError, what: str) -> StoreError:
        """sqlite3's error as a ``StoreError`` naming the file."""
        message = str(exc)
        if "file is not a database" in message or "malformed" in message:
            return StoreError(f"{self.path} is not a usable SQLite database ({message})")
        return StoreError(f"SQLite {what} failed on {self.path}: {message}")

    def not_text(self, exc: UnicodeEncodeError, what: str) -> StoreError:
        bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else "?"
        return StoreError(
            f"SQLite {what} on {self.path}: a value is not valid UTF-8 text ({bad!r}); "
            "nothing was written"
        )

    def serve_queued(self) -> None:
        """Commit the writes threads queued while the lock was held."""
        group = self.group
        if group is not None and group.pending:
            group.serve()

    def raise_translated(self, exc: BaseException | None, what: str) -> None:
        """The driver's error raised in a scope, as the store's one-line ``StoreError``."""
        if isinstance(exc, sqlite3.DatabaseError):
            raise self.translate(exc, what) from exc
        if isinstance(exc, UnicodeEncodeError):
            raise self.not_text(exc, what) from exc

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.conn.close()


class ReadScope:
    """Lock, closed check and error translation, as a plain class: these run on every
    store call, where generator-based context managers cost more than the SQL."""

    __slots__ = ("_link", "_what")

    def __init__(self, link: SqliteConnection, what: str) -> None:
        self._link = link
        self._what = what

    def __enter__(self) -> sqlite3.Connection:
        link = self._link
        link.lock.acquire()
        if link.closed:
            link.lock.release()
            raise StoreError(f"SqliteTaskStore({link.path}) is closed")
        return link.conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link = self._link
        link.lock.release()
        link.serve_queued()  # writes queued while we held the lock
        link.raise_translated(exc, self._what)


class WriteScope:
    """``BEGIN IMMEDIATE ... COMMIT`` under the connection's lock; nested inside
    ``atomic()``, part of the caller's transaction."""

    __slots__ = ("_link", "_nested", "_what")

    def __init__(self, link: SqliteConnection, what: str) -> None:
        self._link = link
        self._what = what
        self._nested = False

    def __enter__(self) -> sqlite3.Connection:
        link = self._link
        link.lock.acquire()
        try:
            if link.closed:
                raise StoreError(f"SqliteTaskStore({link.path}) is closed")
            if link.depth:  # inside atomic(): part of the caller's transaction
                link.depth += 1
                self._nested = True
                return link.conn
            link.conn.execute("BEGIN IMMEDIATE")
            link.depth = 1
            link.holder = threading.get_ident()
            return link.conn
        except sqlite3.DatabaseError as exc:
            link.lock.release()
            raise link.translate(exc, self._what) from exc
        except BaseException:
            link.lock.release()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        link = self._link
        if self._nested:
            link.depth -= 1
            link.lock.release()
            link.raise_translated(exc, self._what)
            return
        conn = link.conn
        try:
            link.depth = 0
            link.holder = None
            if exc is None:
                conn.execute("COMMIT")
                link.committed()
            else:
                conn.execute("ROLLBACK")
        except sqlite3.DatabaseError as end_error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise link.translate(end_error, "commit") from end_error
        finally:
            link.lock.release()
            link.serve_queued()  # writes queued while we held the lock
        link.raise_translated(exc, self._what)
