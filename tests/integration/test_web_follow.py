"""The dashboard's follower hears of a transition written by another process: at once
through LISTEN/NOTIFY on Postgres (the writing store announces its writes), by polling
on SQLite."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore
from chongming_task.stores.capabilities import Capabilities
from chongming_task.stores.protocol import TaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import listening, pg_dsn, schema  # noqa: F401

pytest.importorskip("prometheus_client", reason="the [web] extra is not installed")

from prometheus_client import CollectorRegistry

from chongming_task.web.follow import Follower

# One short task run by a node process of its own: three appends of transitions.
_WRITER = """
import sys
from chongming_task import Controller, PostgresTaskStore, SqliteTaskStore
target = sys.argv[1]
announce = sys.argv[3:] != ["quiet"]
store = (PostgresTaskStore(target, schema=sys.argv[2], announce_writes=announce)
         if target.startswith("postgresql") else SqliteTaskStore(target))
with Controller(store, owner="writer", poll_commands=False) as node:
    node.submit(node.task(lambda token: None, name="noticed")).result(30)
store.close()
"""


def _write_one_task(*target: str) -> None:
    """Run a task to its end in another process."""
    subprocess.run([sys.executable, "-c", _WRITER, *target], check=True, timeout=60)


def _follows(store: TaskStore, *, interval: float) -> Follower:
    follower = Follower(Capabilities(store), CollectorRegistry(), num_buckets=64, interval=interval)
    follower.start()
    return follower


def _bumped(follower: Follower, since: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if follower.version != since:
            return True
        time.sleep(0.02)
    return follower.version != since


def test_postgres_notifies_the_follower_of_another_process_transition(
    pg_dsn: str,  # noqa: F811
    schema: str,  # noqa: F811
) -> None:
    from chongming_task import PostgresTaskStore

    store = PostgresTaskStore(pg_dsn, schema=schema, application_name=f"follow-{schema}")
    # Polling every minute: within the test only a notification can wake a pass.
    follower = _follows(store, interval=60)
    try:
        assert follower.notified
        wait_until(lambda: listening(pg_dsn, f"follow-{schema}"), what="the follower's LISTEN")
        before = follower.version
        _write_one_task(pg_dsn, schema)
        assert _bumped(follower, before, within=2.0), "no pass within 2 s of the transitions"
        counted = sum(m.samples[0].value for m in follower.transitions.collect() if m.samples)
        assert counted >= 1
    finally:
        follower.stop()
        store.close()


def test_a_writer_that_does_not_announce_is_only_seen_by_polling(
    pg_dsn: str,  # noqa: F811
    schema: str,  # noqa: F811
) -> None:
    """The control for the test above: the same writer with ``announce_writes=False``
    notifies nobody, so a follower polling every minute stays behind."""
    from chongming_task import PostgresTaskStore

    store = PostgresTaskStore(pg_dsn, schema=schema, application_name=f"quiet-{schema}")
    follower = _follows(store, interval=60)
    try:
        # Listening like the test above's follower: were the writer to announce, it would hear.
        wait_until(lambda: listening(pg_dsn, f"quiet-{schema}"), what="the follower's LISTEN")
        before = follower.version
        _write_one_task(pg_dsn, schema, "quiet")
        assert not _bumped(follower, before, within=2.0)
    finally:
        follower.stop()
        store.close()


def test_sqlite_is_followed_by_polling(tmp_path: Path) -> None:
    db = tmp_path / "follow.db"
    store = SqliteTaskStore(db)
    follower = _follows(store, interval=0.5)
    try:
        assert not follower.notified
        before = follower.version
        _write_one_task(str(db))
        assert _bumped(follower, before, within=2.0)
    finally:
        follower.stop()
        store.close()
