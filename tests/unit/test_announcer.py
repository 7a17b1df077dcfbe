"""The Postgres store's Announcer: a write only sets a flag; notifications follow soon,
a burst of writes costs one, and a failing send never stops the next."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")

from chongming_task.stores.postgres.listen import Announcer
from tests.conftest import wait_until


def test_a_burst_of_writes_is_told_at_once_and_then_once_more() -> None:
    sent: list[float] = []
    announcer = Announcer(lambda: sent.append(time.monotonic()), every=2.0, name="t")
    try:
        first = time.monotonic()
        for _ in range(1000):
            announcer.wrote()
        wait_until(lambda: len(sent) >= 1, timeout=5, what="first notification")
        # The first write after a quiet spell is told at once, not after ``every``.
        assert sent[0] - first < 1.0
        time.sleep(0.5)
        # The 999 writes after the first were told by one more send, at most: never one
        # per write.
        assert len(sent) <= 2
    finally:
        announcer.close()


def test_writes_during_a_send_get_a_send_of_their_own() -> None:
    sent: list[int] = []
    release = threading.Event()

    def send() -> None:
        sent.append(len(sent))
        release.wait(2)

    announcer = Announcer(send, every=0.05, name="t")
    try:
        announcer.wrote()
        wait_until(lambda: len(sent) == 1, timeout=2, what="first send")
        announcer.wrote()  # committed while the first send is under way
        release.set()
        wait_until(lambda: len(sent) == 2, timeout=2, what="a second send")
    finally:
        announcer.close()


def test_a_failing_send_does_not_stop_the_next() -> None:
    calls: list[int] = []

    def send() -> None:
        calls.append(1)
        raise OSError("server away")

    announcer = Announcer(send, every=0.01, name="t")
    try:
        announcer.wrote()
        wait_until(lambda: len(calls) == 1, timeout=2, what="first send")
        time.sleep(0.05)
        announcer.wrote()
        wait_until(lambda: len(calls) == 2, timeout=2, what="second send")
    finally:
        announcer.close()
    announcer.wrote()  # after close: nothing starts, nothing raises
    time.sleep(0.05)
    assert len(calls) == 2


def test_the_thread_ends_when_quiet_and_comes_back_with_a_write() -> None:
    sent: list[int] = []
    announcer = Announcer(lambda: sent.append(1), every=0.01, name="chongming-announce[q]")
    announcer.IDLE = 0.1  # type: ignore[misc]

    def alive() -> bool:
        return any(t.name == "chongming-announce[q]" for t in threading.enumerate())

    try:
        announcer.wrote()
        wait_until(lambda: len(sent) == 1, timeout=2, what="first send")
        wait_until(lambda: not alive(), timeout=2, what="the thread to end")
        announcer.wrote()
        wait_until(lambda: len(sent) == 2, timeout=2, what="a send after the restart")
    finally:
        announcer.close()
