"""Which pages a per-call SQLite task writes: WAL frames a commit, by B-tree.

    uv run python bench/sqlite_pages.py [--tasks 3000] [--warm 2000]

Every commit copies each page it dirtied into the WAL (two ``pwrite`` calls a page), so
the pages a task's commit dirties are most of what a durable task costs SQLite. This
runs ``--warm`` tasks (so the trees have depth), checkpoints, then submits ``--tasks``
no-op tasks one by one (``Controller.submit``, 4 workers, as ``bench/throughput.py``'s
per-call row) with checkpoints off (the store's background ones too), reads the WAL
back frame by frame, and names each frame's page by the B-tree that holds it now
(SQLite's ``dbstat``). A page counts once per commit that wrote it.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import struct
import tempfile
from pathlib import Path

from chongming_task import CancellationToken, Controller, SqliteTaskStore

_WAL_HEADER = 32
_FRAME_HEADER = 24


def noop_task(token: CancellationToken) -> None:
    return None


def wal_commits(wal: bytes) -> list[set[int]]:
    """The pages each commit in ``wal`` wrote, in order (a commit frame carries the
    database size after it; the others carry 0)."""
    (page_size,) = struct.unpack(">I", wal[8:12])
    commits: list[set[int]] = []
    pages: set[int] = set()
    offset = _WAL_HEADER
    while offset + _FRAME_HEADER + page_size <= len(wal):
        page, size_after = struct.unpack(">II", wal[offset : offset + 8])
        pages.add(page)
        offset += _FRAME_HEADER + page_size
        if size_after:
            commits.append(pages)
            pages = set()
    return commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pages.db"
        store = SqliteTaskStore(path)
        controller = Controller(store, max_workers=4)
        try:
            job = controller.task(noop_task, name="noop")
            for run in [controller.submit(job) for _ in range(args.warm)]:
                run.wait(60)
            # Every frame stays in the WAL to be read back: no background checkpoint
            # (the store's Checkpointer would let the WAL start over), none by commits.
            checkpointer = store.checkpointer
            assert checkpointer is not None
            checkpointer.close()
            store.connection.conn.execute("PRAGMA wal_autocheckpoint = 0")
            store.connection.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for run in [controller.submit(job) for _ in range(args.tasks)]:
                run.wait(60)
            shutil.copy(f"{path}-wal", Path(tmp) / "copy.wal")
            owner = dict(
                (page, name)
                for name, page in store.connection.conn.execute("SELECT name, pageno FROM dbstat")
            )
        finally:
            controller.close()
            store.close()
        commits = wal_commits((Path(tmp) / "copy.wal").read_bytes())
    by_tree: collections.Counter[str] = collections.Counter()
    for pages in commits:
        by_tree.update(owner.get(page, "(freed)") for page in pages)
    print(
        f"{args.tasks} per-call tasks after {args.warm}: {len(commits) / args.tasks:.2f} "
        f"commits a task, {by_tree.total() / args.tasks:.2f} pages a task"
    )
    for tree, pages in by_tree.most_common():
        print(f"  {tree:32} {pages / args.tasks:5.2f}")


if __name__ == "__main__":
    main()
