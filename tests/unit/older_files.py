"""A SQLite file as an earlier release made it, holding one task, for the migration
tests: the schema from ``data/sqlite_schema_<version>.sql`` (a copy of that release's
``sqlite_master``), the task written through that release's write view."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chongming_task.stores import codec

DATA = Path(__file__).parent / "data"


def older_file(path: Path, version: int, columns: Sequence[str], values: Sequence[Any]) -> None:
    """Make ``path`` at schema ``version`` with one task: ``values`` in ``columns`` order
    (the columns that release had), and its first transition, "made by the older
    release", at the task's ``created_at``."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript((DATA / f"sqlite_schema_{version}.sql").read_text())
    trail = [c for c in codec.TRANSITION_COLUMNS if c != "task_id"]
    at = values[list(columns).index("created_at")]
    conn.execute(
        f"INSERT INTO task_writes (kind, {', '.join(columns)}, {', '.join(trail)}) "
        f"VALUES ('new', {', '.join('?' * (len(columns) + len(trail)))})",
        [*values, 1, None, values[list(columns).index("status")], at,
         "made by the older release", "n"],
    )  # fmt: skip
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
