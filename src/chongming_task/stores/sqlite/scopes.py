"""The SQLite store's two scopes: a read (or one statement) under the connection lock,
and a write transaction (``BEGIN IMMEDIATE ... COMMIT``). Both check the store is open,
translate the driver's errors, and serve the group commit's queue on release."""

from __future__ import annotations

import sqlite3
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from ...errors import StoreError

if TYPE_CHECKING:
    from .store import SqliteTaskStore

__all__ = ["ReadScope", "WriteScope"]


def _raise_translated(store: SqliteTaskStore, exc: BaseException | None, what: str) -> None:
    """The driver's error raised in a scope, as the store's one-line ``StoreError``."""
    if isinstance(exc, sqlite3.DatabaseError):
        raise store._translate(exc, what) from exc
    if isinstance(exc, UnicodeEncodeError):
        raise store._not_text(exc, what) from exc


class ReadScope:
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
        if store._group.pending:
            store._group.serve()  # writes queued while we held the lock
        _raise_translated(store, exc, self._what)


class WriteScope:
    """``SqliteTaskStore._write``: ``BEGIN IMMEDIATE ... COMMIT`` under the store's lock;
    nested inside ``atomic()``, part of the caller's transaction."""

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
            _raise_translated(store, exc, self._what)
            return
        try:
            store._depth = 0
            store._holder = None
            if exc is None:
                store._conn.execute("COMMIT")
                store._committed()
            else:
                store._conn.execute("ROLLBACK")
        except sqlite3.DatabaseError as end_error:
            if store._conn.in_transaction:
                store._conn.execute("ROLLBACK")
            raise store._translate(end_error, "commit") from end_error
        finally:
            store._lock.release()
            if store._group.pending:
                store._group.serve()  # writes queued while we held the lock
        _raise_translated(store, exc, self._what)
