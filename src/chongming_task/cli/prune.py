"""``prune``: finished tasks deleted by age (``--older-than``, in batches, each a short
transaction) or beyond a count (``--keep``), then, on SQLite, the space: what the file
keeps free for new tasks, or, with ``--compact``, what it gave back to the disk."""

from __future__ import annotations

import sys
import time

from .. import present
from ..model import TaskStatus
from ..states import TERMINAL
from ..stores.capabilities import Capabilities
from ..stores.sqlite import SqliteTaskStore
from .context import Context
from .parser import PROG, UsageError

__all__ = ["BATCH", "cmd_prune"]

BATCH = 500
"""Tasks a prune transaction deletes: short enough that nodes' writes barely wait."""


def size(n: float) -> str:
    """Bytes as people read them: 37.0 KiB, 865.3 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def cmd_prune(ctx: Context) -> int:
    a = ctx.args
    if a.keep is not None and a.status:
        raise UsageError("--status goes with --older-than (--keep counts every finished task)")
    store = ctx.store()
    if a.compact and not isinstance(store, SqliteTaskStore):
        raise UsageError(
            "--compact is for a SQLite file: PostgreSQL's autovacuum makes the space reusable"
        )
    statuses = frozenset(TaskStatus(s) for s in a.status) if a.status else None
    if a.older_than is not None:
        what = (
            f"finished task(s) that ended more than {present.age(a.older_than.total_seconds())} "
            "ago" + ("" if statuses is None else f" ({', '.join(sorted(a.status))})")
        )
    else:
        what = f"finished task(s) beyond the newest {a.keep}"
    # Commands have no status: they are pruned by age with every finished task.
    commands = a.older_than is not None and statuses is None
    if a.dry_run:
        gone = 0
        if a.older_than is not None:
            retention = Capabilities(store).prune_by_age
            before = ctx.now() - a.older_than
            doomed = retention.count_ended(before=before, statuses=statuses)
            gone = retention.count_finished_commands(before=before) if commands else 0
        else:
            counts = Capabilities(store).count_tasks("status", statuses=TERMINAL)
            doomed = max(0, sum(counts.values()) - a.keep)
        said: dict[str, object] = {"dry_run": True, "pruned": doomed}
        if commands:
            said["commands_pruned"] = gone
        ctx.emit(
            said,
            f"would prune {doomed} {what} and their history"
            + (f", and {gone} finished command(s)" if commands else "")
            + " (nothing deleted)",
        )
        return 0
    pruned, gone, interrupted = _prune(ctx, statuses, commands=commands)
    data: dict[str, object] = {"pruned": pruned}
    if commands:
        data["commands_pruned"] = gone
    lines = [
        f"pruned {pruned} {what} and their history"
        + (f", and {gone} finished command(s)" if commands else "")
    ]
    if interrupted:
        lines[0] += " before Ctrl-C (each batch is kept)"
    elif isinstance(store, SqliteTaskStore):
        total, free = store.space()
        if a.compact:
            freed = store.compact()
            data.update(compacted=True, freed_bytes=freed, file_bytes=total - freed)
            lines.append(
                f"compacted the file: {size(freed)} given back to the disk "
                f"({size(total)} → {size(total - freed)})"
            )
        else:
            data.update(free_bytes=free, file_bytes=total)
            if free:
                lines.append(
                    f"the file keeps {size(free)} of free pages (of {size(total)}) "
                    "for new tasks; prune --compact gives them back to the disk"
                )
    ctx.emit(data, "\n".join(lines))
    if interrupted:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


def _prune(
    ctx: Context, statuses: frozenset[TaskStatus] | None, *, commands: bool
) -> tuple[int, int, bool]:
    """How many tasks and finished commands were pruned, and whether Ctrl-C cut it
    short (between batches)."""
    a, store = ctx.args, ctx.store()
    if a.older_than is None:
        return store.prune(keep_terminal=a.keep), 0, False
    retention = Capabilities(store).prune_by_age
    before = ctx.now() - a.older_than
    pruned = gone = 0
    tasks_left = True
    try:
        while True:
            began = time.monotonic()
            batch = 0
            if tasks_left:
                batch = retention.prune_ended(before=before, statuses=statuses, limit=BATCH)
                pruned += batch
                tasks_left = batch == BATCH
            if commands and not tasks_left:
                batch = retention.prune_finished_commands(before=before, limit=BATCH)
                gone += batch
            if batch < BATCH and not tasks_left:
                return pruned, gone, False
            # As long again before the next batch: SQLite hands its write lock to no one
            # in turn, and a loop straight into the next batch kept a node's submits
            # waiting 4.4 s (bench/retention.py); with the pause, at most 79 ms while
            # 900,000 of a million tasks went.
            time.sleep(time.monotonic() - began)
    except KeyboardInterrupt:
        return pruned, gone, True
