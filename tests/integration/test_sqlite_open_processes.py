"""Nodes started together on a new SQLite file: each opens it, and each open makes the
file (schema, WAL) or finds it made, however the opens interleave.

The children open the file at one moment (``tests.integration.together``): the opens
race on the file, not on interpreter start-up. Before the open tried the WAL switch
again, some opens failed with "database is locked": this test saw it in about half its
runs on this VM (2 cores). The unit test that holds the file in that
state on purpose fails without the retry every time:
tests/unit/test_sqlite_store.py::test_an_open_waits_for_another_process_making_the_file.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from chongming_task.stores import SqliteTaskStore
from tests.integration.together import BARRIER, run_together

NODE = (
    """
import sys
from datetime import UTC, datetime
from chongming_task import TaskSnapshot, TaskStatus
from chongming_task.stores import SqliteTaskStore
path, name = sys.argv[1], sys.argv[2]
"""
    + BARRIER
    + """
store = SqliteTaskStore(path)
store.create(TaskSnapshot(task_id=name, name="n", status=TaskStatus.QUEUED,
                          status_version=1, created_at=datetime(2026, 3, 1, tzinfo=UTC)))
store.close()
"""
)

NODES = 6
ROUNDS = 4


def test_nodes_opening_a_new_file_together_all_open_it(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        path = tmp_path / f"new-{round_}.db"
        for child in run_together(NODE, [[str(path), f"node-{n}"] for n in range(NODES)]):
            assert child.returncode == 0, child.stderr
        store = SqliteTaskStore(path)
        try:
            assert sorted(t.task_id for t in store.query()) == [f"node-{n}" for n in range(NODES)]
        finally:
            store.close()
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
