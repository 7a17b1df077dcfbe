"""``LISTEN`` on a PostgreSQL channel from a connection and a thread of its own.

A notification is a hint that something changed, never the change itself: every
subscriber keeps polling the tables (distributed design §17 point 4), so a notification
lost while the server was away only costs latency. The driver is imported by the caller
(``postgres.py``); this module is only reached once it is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg

__all__ = ["listen"]

_RECONNECT_AFTER = 1.0
"""Seconds between attempts while the server is away (polling carries on meanwhile)."""


def listen(dsn: str, channel: str, wake: Callable[[], None], *, name: str) -> Callable[[], None]:
    """Call ``wake()`` for each notification on ``channel`` (a validated identifier), on
    a daemon thread called ``name`` that reconnects after failures. Returns a function
    that stops it (and waits up to 5 s for the thread)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {channel}".encode())
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            wake()
            except psycopg.Error:
                stop.wait(_RECONNECT_AFTER)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def unsubscribe() -> None:
        stop.set()
        thread.join(5)

    return unsubscribe
