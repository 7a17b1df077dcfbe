"""The SQLite store's WAL is copied back by a thread of its own (``Checkpointer``), never
by the caller whose commit takes it past a threshold."""

from __future__ import annotations

import contextlib
import gc
import logging
import sqlite3
import struct
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chongming_task import TaskSnapshot, TaskStatus
from chongming_task.stores import SqliteTaskStore
from chongming_task.stores.sqlite import checkpoint as _sqlite_checkpoint
from chongming_task.stores.sqlite.checkpoint import Checkpointer

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def snap(task_id: str) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task_id, name="n", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )


def wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def create_one_by_one(store: SqliteTaskStore, prefix: str, count: int) -> None:
    for i in range(count):
        store.create(snap(f"{prefix}-{i:05d}"))  # one commit each, as per-call submit


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def checkpointer(store: SqliteTaskStore) -> Checkpointer:
    found = store.checkpointer
    assert found is not None
    return found


def started(store: SqliteTaskStore) -> tuple[Checkpointer, threading.Thread]:
    """Enough commits to start the thread, and its first checkpoint made."""
    create_one_by_one(store, "a", Checkpointer.START_AFTER)
    c = checkpointer(store)
    wait_for(lambda: c.passes >= 1, "the first checkpoint")
    thread = c.thread
    assert thread is not None and thread.is_alive()
    return c, thread


def wal_restarts(path: Path) -> int:
    """The WAL header's checkpoint sequence number: one more each time the WAL starts
    over from its beginning."""
    wal = path.with_name(path.name + "-wal")
    with contextlib.suppress(FileNotFoundError), wal.open("rb") as f:
        header = f.read(16)
        if len(header) == 16:
            return int(struct.unpack(">I", header[12:16])[0])
    return 0


def write_for(store: SqliteTaskStore, path: Path, seconds: float) -> tuple[int, int]:
    """Commit creates one by one, with no pause, for ``seconds``: how many times the WAL
    started over meanwhile, and its largest size."""
    first = wal_restarts(path)
    largest = 0
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        create_one_by_one(store, f"r{n}", 100)
        n += 1
        largest = max(largest, wal_bytes(path))
    return wal_restarts(path) - first, largest


def test_commits_leave_the_wal_to_the_thread_which_keeps_it_from_growing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Checkpointer, "INTERVAL", 0.01)
    monkeypatch.setattr(Checkpointer, "RESTART_FRAMES", 512)
    path = tmp_path / "c.db"
    store = SqliteTaskStore(path)
    try:
        (auto,) = store.connection.conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert auto == 0  # no commit checkpoints on its caller's time
        # A steady stream of commits, never a pause for a checkpoint to catch up in:
        # the WAL starts over again and again (copied back to the frame each time).
        restarts, largest = write_for(store, path, 0.4)
        assert restarts >= 3, (restarts, largest)
        assert checkpointer(store).passes >= restarts
        thread = checkpointer(store).thread
        assert thread is not None and thread.is_alive() and thread.name == Checkpointer.name
    finally:
        store.close()


def test_without_the_thread_the_wal_keeps_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: no thread, no checkpoint, no new start."""
    monkeypatch.setattr(Checkpointer, "_run", lambda self: None)
    path = tmp_path / "c.db"
    store = SqliteTaskStore(path)
    try:
        restarts, largest = write_for(store, path, 0.4)
        assert restarts == 0
        assert largest > 2 * 1024 * 1024  # every frame of 0.4 s of commits (~20 MB here)
    finally:
        store.close()


def test_the_last_frames_are_copied_once_commits_stop(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SqliteTaskStore(path)
    try:
        create_one_by_one(store, "a", 300)
        c = checkpointer(store)
        wait_for(lambda: c.asleep, "the thread to run out of work")
        assert c.last is not None and c.last[1] == c.last[2] > 0
        with sqlite3.connect(path) as other:  # nothing was left to copy
            assert other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall() == [c.last]
        with sqlite3.connect(path) as other:  # and every row is in the file
            assert other.execute("SELECT COUNT(*) FROM tasks").fetchone() == (300,)
    finally:
        store.close()


def test_close_ends_the_thread_and_no_commit_starts_it_again(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "c.db")
    c, thread = started(store)
    store.close()
    assert not thread.is_alive()
    c.committed()  # as a commit racing close() would
    assert c.thread is thread


def test_a_store_dropped_without_close_is_collected_and_its_thread_ends(
    tmp_path: Path,
) -> None:
    store = SqliteTaskStore(tmp_path / "c.db")
    _, thread = started(store)
    dropped = weakref.ref(store)
    del store
    gc.collect()
    assert dropped() is None  # the thread did not keep it alive
    thread.join(5)
    assert not thread.is_alive()


def test_close_cuts_a_long_checkpoint_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def endless(conn: sqlite3.Connection) -> tuple[int, int, int]:
        # Stands for a pass over a WAL of gigabytes: runs until interrupted.
        endless_count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        conn.execute(endless_count + "SELECT COUNT(*) FROM c").fetchall()
        raise AssertionError("not interrupted")

    monkeypatch.setattr(Checkpointer, "_pass", staticmethod(endless))
    store = SqliteTaskStore(tmp_path / "c.db")
    create_one_by_one(store, "a", Checkpointer.START_AFTER)  # the thread starts its pass
    c = checkpointer(store)
    wait_for(lambda: c.connected, "the thread's connection")
    time.sleep(0.05)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="chongming_task.store"):
        store.close()
    assert time.monotonic() - began < 10  # the pass never ends by itself: interrupted
    thread = c.thread
    assert thread is not None and not thread.is_alive()
    assert "checkpoint" not in caplog.text  # an interrupt asked for is no failure


def test_a_thread_that_cannot_connect_hands_checkpoints_back_to_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteTaskStore(tmp_path / "c.db")
    try:

        def refuse(*args: object, **kwargs: object) -> sqlite3.Connection:
            raise sqlite3.OperationalError("unable to open database file")

        # The store's own connection is open already; only the thread's is refused.
        monkeypatch.setattr(_sqlite_checkpoint.sqlite3, "connect", refuse)
        with caplog.at_level(logging.WARNING, logger="chongming_task.store"):
            create_one_by_one(store, "first", Checkpointer.START_AFTER)
            thread = checkpointer(store).thread
            assert thread is not None
            thread.join(5)
        assert "no background checkpoints (unable to open database file)" in caplog.text
        (auto,) = store.connection.conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert auto == 8192  # commits checkpoint again, so the WAL stays bounded
        store.create(snap("second"))  # and writes go on
        assert store.get("second") is not None
    finally:
        store.close()


def test_a_process_that_writes_a_few_times_makes_no_thread(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "c.db")
    try:
        create_one_by_one(store, "a", Checkpointer.START_AFTER - 1)
        assert checkpointer(store).thread is None
        create_one_by_one(store, "b", 1)
        thread = checkpointer(store).thread
        assert thread is not None and thread.is_alive()
    finally:
        store.close()


def test_a_store_in_memory_has_no_wal_and_no_thread() -> None:
    store = SqliteTaskStore(":memory:")
    try:
        assert store.checkpointer is None  # nothing to start: commits call a no-op
        store.create(snap("m"))
        assert store.get("m") is not None
    finally:
        store.close()
