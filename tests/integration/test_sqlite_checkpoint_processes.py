"""Two processes committing to one SQLite file all the time: each store's checkpoint
thread copies the WAL back, and the WAL stops growing (it starts over again and again).

Each writer pauses 0.2 ms between creates, as a caller does some work between writes:
two loops of bare commits make SQLite's busy handler (it sleeps, then tries again)
starve one of them for seconds.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import time
from pathlib import Path

from chongming_task.stores import SqliteTaskStore

WRITER = """
import sys, time
from datetime import UTC, datetime
from chongming_task import TaskSnapshot, TaskStatus
from chongming_task.stores import SqliteTaskStore
from chongming_task.stores.sqlite.checkpoint import Checkpointer
Checkpointer.RESTART_FRAMES = 1024  # more new starts in 3 s, on a slow machine too
path, name, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SqliteTaskStore(path)
at = datetime(2026, 3, 1, tzinfo=UTC)
end = time.monotonic() + seconds
made = 0
while time.monotonic() < end:
    store.create(TaskSnapshot(task_id=f"{name}-{made}", name="n", status=TaskStatus.QUEUED,
                              status_version=1, created_at=at))
    made += 1
    time.sleep(0.0002)
store.close()
print(made)
"""


def test_two_processes_committing_all_the_time_keep_the_wal_bounded(tmp_path: Path) -> None:
    path = tmp_path / "two.db"
    SqliteTaskStore(path).close()
    wal = path.with_name(path.name + "-wal")
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), name, "3"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    restarts = set()
    largest = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        time.sleep(0.01)
        with contextlib.suppress(FileNotFoundError), wal.open("rb") as f:
            header = f.read(16)
            if len(header) == 16:  # the checkpoint sequence: one more at each new start
                restarts.add(struct.unpack(">I", header[12:16])[0])
            largest = max(largest, wal.stat().st_size)
    made = [int(w.communicate(timeout=60)[0]) for w in writers]
    assert all(w.returncode == 0 for w in writers)
    # Each process made thousands of commits of several pages; the WAL was copied back
    # and started over again and again, whichever process wrote last.
    assert min(made) > 1000, made
    # (Seen at 4,096 frames: 7 starts and at most 9 MB; with the last pass not holding
    # SQLite's write lock, 1 or 2 and up to 88 MB, trimmed back by journal_size_limit.)
    assert len(restarts) >= 4, restarts
    assert largest < 32 * 1024 * 1024, largest
    reader = SqliteTaskStore(path)
    try:
        assert sum(reader.counts().values()) == sum(made)
    finally:
        reader.close()
