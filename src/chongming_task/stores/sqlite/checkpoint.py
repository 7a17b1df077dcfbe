"""``Checkpointer``: copies a SQLite store's WAL back into its database file on a
thread of its own, so the thread that commits never does.

In WAL mode a commit only appends pages to the WAL; something must copy them back into
the database file (a checkpoint) before the WAL can start over. By default SQLite makes
the commit that takes the WAL past ``wal_autocheckpoint`` pages do it, on the caller's
thread and inside its call: one ``submit`` in every few hundred paid for copying some
8,000 pages and two ``fsync`` calls: 12-17 ms at the 99.9th percentile of per-call
``submit``, where the median was 0.23 ms (``bench/submit_latency.py``).

Here the store's connection has automatic checkpoints off, and this thread runs a
``PASSIVE`` checkpoint (it never waits for a lock, nor makes a writer or a reader wait)
on a connection of its own, at most every ``INTERVAL`` while commits come. The copying
moves to another core (the statement releases the interpreter's lock); what a commit
costs is a flag set (``committed``). Idle, the thread sleeps until the next commit. It
starts at the 16th commit, so a process that writes once makes no thread.

The WAL starts over only at a commit that finds every frame in it copied back, which a
checkpoint racing a steady stream of commits never leaves: the WAL would grow without
end. So once it holds ``RESTART_FRAMES``, the bulk pass is followed by passes that copy what
was written during the one before, each less, the last holding the store's lock
(``hold``): no commit of this process lands meanwhile, and the next commit starts the
WAL over; it is a ``RESTART`` checkpoint, which holds SQLite's write lock too, so that
no other process's commit comes between either. Callers wait for that short pass (a few
pages and the two ``fsync`` calls a checkpoint makes) once every few thousand frames,
where one of them used to make the whole copy.

If the thread cannot open its connection, the store's own connection checkpoints again as
before (``fallback``), so the WAL never grows without bound.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ...errors import StoreError
from ...loops import Pass, keep_running

__all__ = ["Checkpointer"]

log = logging.getLogger("chongming_task.store")


class Checkpointer:
    """One store's background checkpoints (started after ``START_AFTER`` commits)."""

    INTERVAL = 0.25
    """Seconds between checkpoints while commits come. Each pass that copies makes two
    ``fsync`` calls, which stall the file system's other writers for a moment: at 0.05 s
    the commits' 99th percentile rose."""

    RESTART_FRAMES = 4096
    """Frames in the WAL past which a pass ends holding the store's lock, so that the WAL
    starts over (4 MiB at the 1 KiB pages of a new file)."""

    CATCH_UP_FRAMES = 64
    """Frames few enough for the pass that holds the store's lock to copy."""

    RESTART_WAIT = 0.05
    """Seconds the last pass waits for SQLite's locks (see ``_restart``)."""

    START_AFTER = 16
    """Commits before the thread starts: a short-lived process (a CLI command that writes
    once) makes no thread for a few pages, which closing the file copies back anyway."""

    name = "chongming-checkpoint"

    def __init__(
        self,
        path: str,
        *,
        hold: Callable[[], AbstractContextManager[Any]],
        fallback: Callable[[], None],
    ) -> None:
        """``path`` is the database file; ``with hold():`` keeps the store's commits
        out (and lets them go after); ``fallback`` turns the store's automatic checkpoints
        back on (called if this thread cannot open its connection)."""
        self._path = path
        self._hold = hold
        self._fallback = fallback
        self._wake = threading.Event()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._connection: sqlite3.Connection | None = None  # the thread's, while it runs
        self._closed = False
        # Plain attributes, read and written under the interpreter's lock: a commit sets
        # ``_dirty`` and looks at ``_asleep``; the thread publishes ``_asleep`` before it
        # looks at ``_dirty``, so one of the two always sees the other.
        self._dirty = False
        self._asleep = True  # not started counts as asleep: commits count towards a start
        self._early = 0  # commits before the start
        self.passes = 0
        """Checkpoints run (for tests and curious operators)."""
        self.last: tuple[int, int, int] | None = None
        """The last checkpoint's (busy, frames in the WAL, frames copied back)."""
        self._failed: str | None = None  # the last failure's words, logged once
        self._ended = False  # the store closed under a pass: the thread ends

    @property
    def thread(self) -> threading.Thread | None:
        """The thread copying the WAL back, once a commit started it."""
        return self._thread

    @property
    def asleep(self) -> bool:
        """Whether the thread waits for commits (no work in hand), or was never started."""
        return self._asleep

    @property
    def connected(self) -> bool:
        """Whether the thread holds its own connection (while it runs)."""
        return self._connection is not None

    def committed(self) -> None:
        """Called after every commit: the WAL has pages to copy back."""
        self._dirty = True
        if self._asleep:
            self._wake_up()

    def _wake_up(self) -> None:
        if self._thread is None:
            self._early += 1
            if self._early < self.START_AFTER:
                return
            with self._start_lock:
                if self._thread is None and not self._closed:
                    # Daemon: a store nobody closes must not hold the interpreter at exit
                    # (SQLite needs no checkpoint to stay consistent).
                    target = keep_running(self.name, self._run, stopping=lambda: self._closed)
                    self._thread = threading.Thread(target=target, name=self.name, daemon=True)
                    self._thread.start()
                    return
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread; a checkpoint it is in is cut short (what it copied stays
        copied, and the WAL keeps the rest). Waits up to ``timeout`` for it to end."""
        with self._start_lock:
            self._closed = True
            self._asleep = False  # commits stop calling: nothing is to start or wake
            thread = self._thread
        connection = self._connection
        if connection is not None:
            # A pass over a large WAL must not hold up close(). (The thread may have
            # closed its connection since: then there is nothing to cut short.)
            with contextlib.suppress(sqlite3.ProgrammingError):
                connection.interrupt()
        self._wake.set()
        if timeout and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        # Started by a commit: at work. Commits wake the thread only while it sleeps (and
        # stop calling if it cannot connect: nobody would be there to wake).
        self._asleep = False
        try:
            conn = sqlite3.connect(
                self._path,
                isolation_level=None,
                check_same_thread=False,
                # How long the last pass waits for another process's write or read to
                # end: it holds this process's commits meanwhile. Past it, the pass
                # copies what it can, and the WAL starts over another time.
                timeout=self.RESTART_WAIT,
            )
        except sqlite3.Error as exc:
            log.warning(
                "%s: no background checkpoints (%s); commits checkpoint the WAL themselves",
                self._path,
                exc,
            )
            self._fallback()
            return
        self._connection = conn
        try:
            while not self._closed and not self._ended:
                if not self._dirty:
                    self._asleep = True
                    if not self._dirty:
                        self._wake.wait()
                    self._wake.clear()
                    self._asleep = False
                    continue  # closed, or a commit came: look again
                self.run_once()
                self._wake.wait(self.INTERVAL)  # close() cuts it short
                self._wake.clear()
        finally:
            self._connection = None
            conn.close()

    def run_once(self, now: float | None = None) -> Pass:
        """One checkpoint on the thread's connection if commits came since the last
        (``done``: the frames copied back), the WAL started over past
        ``RESTART_FRAMES``. A failure is logged once per kind; the store closing under
        the pass ends the thread."""
        conn = self._connection
        if conn is None or not self._dirty:
            return Pass()
        self._dirty = False
        try:
            found = self._pass(conn)
            if found[1] >= self.RESTART_FRAMES:
                found = self._restart(conn, found)
        except sqlite3.Error as exc:
            if not self._closed:  # else interrupted by close()
                if str(exc) != self._failed:  # once per kind of failure, not every pass
                    log.warning("%s: background checkpoint failed: %s", self._path, exc)
                self._failed = str(exc)
            return Pass()
        except StoreError:  # the store closed under the pass: so do we
            self._ended = True
            return Pass()
        self._failed = None
        self.last = found
        self.passes += 1
        return Pass(done=found[2])

    def _restart(
        self, conn: sqlite3.Connection, found: tuple[int, int, int]
    ) -> tuple[int, int, int]:
        """Copy back the frames written during the pass that found ``found``, the last
        of them holding the store's lock, so the next commit starts the WAL over. The
        passes before it catch up without the lock, each with less to copy (what was
        written during the one before), so the callers wait for a few pages at most.

        The last pass is a ``RESTART`` checkpoint: it also takes SQLite's write lock
        (waiting up to ``RESTART_WAIT``), so no other process's commit lands in between
        either, and waits for readers of the old frames to finish. Other processes'
        writers wait for it as for any commit."""
        for _ in range(3):
            copied = found[2]
            found = self._pass(conn)
            if found[2] - copied <= self.CATCH_UP_FRAMES:
                break
        with self._hold():  # the frames written meanwhile, and no more
            return self._pass(conn, "RESTART")

    @staticmethod
    def _pass(conn: sqlite3.Connection, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """One checkpoint: (busy, frames in the WAL, frames copied back)."""
        # fetchall: a statement not stepped to its end keeps its read lock, and a reader
        # holding one keeps the WAL from starting over.
        ((busy, frames, copied),) = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        return int(busy), int(frames), int(copied)
