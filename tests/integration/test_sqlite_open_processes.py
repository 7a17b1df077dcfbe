"""Nodes started together on a new SQLite file: each opens it, and each open makes the
file (schema, WAL) or finds it made, however the opens interleave.

Every child imports first and says so, then all are told one moment to open the file
at: the opens race on the file, not on interpreter start-up. Before the open tried the
WAL switch again, some opens failed with "database is locked": this test saw it in
about half its runs on this VM (2 cores). The unit test that holds the file in that
state on purpose fails without the retry every time:
tests/unit/test_sqlite_store.py::test_an_open_waits_for_another_process_making_the_file.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from chongming_task.stores import SqliteTaskStore

NODE = """
import sys, time
from datetime import UTC, datetime
from chongming_task import TaskSnapshot, TaskStatus
from chongming_task.stores import SqliteTaskStore
path, name = sys.argv[1], sys.argv[2]
print("ready", flush=True)
start = float(sys.stdin.readline())
while time.time() < start:  # all at once: a pipe wakes each child in turn
    pass
store = SqliteTaskStore(path)
store.create(TaskSnapshot(task_id=name, name="n", status=TaskStatus.QUEUED,
                          status_version=1, created_at=datetime(2026, 3, 1, tzinfo=UTC)))
store.close()
"""

NODES = 6
ROUNDS = 4


def _open_together(path: Path) -> list[subprocess.CompletedProcess[str]]:
    children = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, str(path), f"node-{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(NODES)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
    start = time.time() + 0.2
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{start}\n")
        child.stdin.flush()
    done = []
    for child in children:
        out, err = child.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(child.args, child.returncode, out, err))
    return done


def test_nodes_opening_a_new_file_together_all_open_it(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        path = tmp_path / f"new-{round_}.db"
        for child in _open_together(path):
            assert child.returncode == 0, child.stderr
        store = SqliteTaskStore(path)
        try:
            assert sorted(t.task_id for t in store.query()) == [f"node-{n}" for n in range(NODES)]
        finally:
            store.close()
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
