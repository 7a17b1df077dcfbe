"""``LISTEN`` on a PostgreSQL channel from a connection and a thread of its own, and
``Announcer``, which sends the ``NOTIFY`` after writes without making a write wait.

A notification is a hint that something changed, never the change itself: every
subscriber keeps polling the tables (docs/design.md, "Commands"), so a notification
lost while the server was away only costs latency. The driver is imported by the caller
(``postgres.py``); this module is only reached once it is installed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from ...loops import Pass, keep_running

__all__ = ["Announcer", "Listener", "Subscriptions", "listen"]

log = logging.getLogger("chongming_task.store")

_RECONNECT_AFTER = 1.0
"""Seconds between attempts while the server is away (polling carries on meanwhile)."""


class Listener:
    """Calls ``wake()`` for each notification on ``channel`` (a validated identifier)
    whose payload ``wanted`` accepts (``None``: every one), on a daemon thread called
    ``name`` that reconnects after failures."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        wake: Callable[[], None],
        *,
        name: str,
        application_name: str = "chongming-task",
        wanted: Callable[[str], bool] | None = None,
    ) -> None:
        self._dsn = dsn
        self._wanted = wanted
        self._application_name = application_name
        self._channel = channel
        self._wake = wake
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        target = keep_running(name, self._run, stopping=self._stop.is_set)
        self._thread = threading.Thread(target=target, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run_once(self, now: float | None = None) -> Pass:
        """Listen (connecting first if need be) for up to half a second, or until the
        first notification; ``done``: the notifications, each passed on to ``wake()``.
        A ``psycopg.Error`` (the server away) is the caller's: the connection is then
        dropped and made again at the next pass."""
        conn = self._conn
        if conn is None:
            conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=5,
                application_name=self._application_name,
            )
            self._conn = conn
            conn.execute(f"LISTEN {self._channel}".encode())
            # Whatever was announced while this had no connection went unheard: one
            # wake-up now, so a subscriber that polls rarely looks at once.
            self._wake()
        heard = 0
        for note in conn.notifies(timeout=0.5, stop_after=1):
            if self._wanted is None or self._wanted(note.payload):
                self._wake()
                heard += 1
        return Pass(done=heard)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.run_once()
                except psycopg.Error:
                    self._drop()
                    self._stop.wait(_RECONNECT_AFTER)
        finally:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def stop(self) -> None:
        """Stop listening; waits up to 5 s for the thread."""
        self._stop.set()
        self._thread.join(5)


def listen(
    dsn: str,
    channel: str,
    wake: Callable[[], None],
    *,
    name: str,
    application_name: str = "chongming-task",
    wanted: Callable[[str], bool] | None = None,
) -> Callable[[], None]:
    """Start a ``Listener``; returns the function that stops it."""
    listener = Listener(
        dsn, channel, wake, name=name, application_name=application_name, wanted=wanted
    )
    listener.start()
    return listener.stop


class Subscriptions:
    """A store's ``LISTEN`` subscriptions on its schema's two channels (commands, and
    writes of tasks and transitions), each a ``Listener`` on a connection of its own to
    ``dsn``: ``len()`` is how many such connections the store holds.

    A command's notification names the node that holds its task (``''``: nobody, so
    anyone), so a node subscribed for itself wakes for its own commands only: with a
    thousand nodes listening, a stop costs one claim, not a thousand."""

    def __init__(self, dsn: str | None, application_name: str, *, where: str, schema: str) -> None:
        self.commands = f"chongming_commands_{schema}"  # a validated identifier
        self.transitions = f"chongming_transitions_{schema}"
        self._dsn = dsn
        self._told = False  # the pooler's warning, said once, to a node
        self._where = where
        self._application_name = application_name
        self._live: set[object] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._live)

    def to_commands(
        self, wake: Callable[[], None], *, holder: str | None = None
    ) -> Callable[[], None] | None:
        """Wake on commands (``holder``'s and nobody's only, if given). Only a node
        subscribes: without a DSN to listen on, it is told once what that costs (a
        command line that merely reads says nothing)."""
        if self._dsn is None and not self._told:
            self._told = True
            log.warning(
                "PostgreSQL at %s through a pooler, without listen_dsn: no LISTEN (a pooler "
                "in transaction mode cannot carry it), so nodes poll commands every 0.5 s and "
                "followers poll too; give listen_dsn= a direct DSN for wake-ups",
                self._where,
            )
        wanted = None if holder is None else (lambda payload: payload in ("", holder))
        return self.listen(self.commands, wake, f"chongming-listen[{self._where}]", wanted)

    def to_transitions(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        return self.listen(self.transitions, wake, f"chongming-follow[{self._where}]")

    def listen(
        self,
        channel: str,
        wake: Callable[[], None],
        name: str,
        wanted: Callable[[str], bool] | None = None,
    ) -> Callable[[], None] | None:
        """``listen()``, counted until the returned function stops it; ``None`` without a
        DSN to listen on (behind a pooler, none given)."""
        if self._dsn is None:
            return None
        stop = listen(
            self._dsn,
            channel,
            wake,
            name=name,
            application_name=self._application_name,
            wanted=wanted,
        )
        token = object()
        with self._lock:
            self._live.add(token)

        def unsubscribe() -> None:
            with self._lock:
                self._live.discard(token)
            stop()

        return unsubscribe


class Announcer:
    """Sends a notification soon after writes, from a thread of its own and at most once
    per ``every`` seconds: a write only sets a flag, and a burst of writes costs one
    ``NOTIFY`` (each takes a server-wide lock at commit, which a ``NOTIFY`` per write
    made every writer queue on). The first write after a quiet spell is told at once;
    later ones up to ``every`` seconds late. The thread ends after ``IDLE`` seconds
    without writes and starts again with the next one."""

    IDLE = 1.0

    def __init__(self, send: Callable[[], None], *, every: float, name: str) -> None:
        self._send = send
        self._every = every
        self._name = name
        self._due = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the flag's rise and the thread's start and end

    def wrote(self) -> None:
        """Something was committed: notify soon (never blocks on the server)."""
        if self._due.is_set():
            return
        with self._lock:
            self._due.set()
            if self._thread is None and not self._stop.is_set():
                target = keep_running(self._name, self._run, stopping=self._stop.is_set)
                self._thread = threading.Thread(target=target, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            if not self._due.wait(self.IDLE):
                with self._lock:
                    if not self._due.is_set():  # quiet: end; the next write starts one
                        self._thread = None
                        return
            if self._stop.is_set():
                return
            self.run_once()
            if self._stop.wait(self._every):
                return

    def run_once(self, now: float | None = None) -> Pass:
        """One pass: a notification if writes came since the last (``done``: 1), sent
        whatever the server says (away, or the store closing: polling carries on)."""
        if not self._due.is_set():
            return Pass()
        self._due.clear()  # writes from now on are told by the next send
        with contextlib.suppress(Exception):
            self._send()
        return Pass(done=1)

    def close(self) -> None:
        self._stop.set()
        self._due.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(2)
