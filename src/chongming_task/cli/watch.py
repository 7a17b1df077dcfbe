"""``watch``: every transition of the tasks the filters select, endings included, with
names, who and why; a live table redrawn in place when stdout is a terminal (``rich``,
from the ``[cli]`` extra), plain lines when piped, JSON lines with ``--json``.

The transitions come from ``TransitionFeed`` (``chongming_task.feed``), over the tasks
the filters select.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import present
from ..feed import RECENT, Change, TransitionFeed
from ..model import TaskSnapshot, Transition
from ..states import SHOWS_PROGRESS
from ..stores.capabilities import Capabilities
from ..text import printable
from .context import Context, find_tasks, task_queries
from .parser import UsageError

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["cmd_watch"]

PROGRESS_EVERY = 10.0
"""Plain output prints a task's progress at most this often (seconds)."""
OVERFLOW = f"(more than {RECENT} tasks were created since the last refresh; some are not shown)"


def _feed(ctx: Context) -> TransitionFeed:
    """The transitions of the tasks ``watch``'s filters select (endings included)."""
    return TransitionFeed(
        ctx.store(),
        task_queries(ctx),
        any_status=not ctx.args.status,
        active=lambda: find_tasks(ctx),
    )


def transition_line(t: Transition, name: str) -> str:
    source = t.from_status.value if t.from_status else "new"
    why = f" ({t.reason})" if t.reason else ""
    who = f" by {t.actor}" if t.actor else ""
    move = f"{source} -> {t.to_status.value}{why}{who}"
    return printable(f"{present.clock(t.at)}  {present.short_id(t.task_id)}  {name}  {move}")


def progress_line(s: TaskSnapshot) -> str:
    message = s.progress.message if s.progress and s.progress.message else ""
    shown = f"{present.bar(s)} {message}".strip() or "-"
    status = present.status_text(s, datetime.now(UTC))
    return printable(f"          {present.short_id(s.task_id)}  {s.name}  {status}  {shown}")


def cmd_watch(ctx: Context) -> int:
    if ctx.args.interval <= 0:
        raise UsageError("--interval must be > 0 seconds")
    feed = _feed(ctx)
    try:
        if ctx.args.json:
            _loop(ctx, feed, _json_out)
        elif sys.stdout.isatty() and _rich_available():
            _live(ctx, feed)
        else:
            _loop(ctx, feed, _plain_out(ctx))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how one leaves watch: no error
    return 0


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _loop(ctx: Context, feed: TransitionFeed, out: Any) -> None:
    tick = threading.Event()
    count = 0
    while True:
        count += 1
        out(feed.poll())
        sys.stdout.flush()
        if ctx.args.count is not None and count >= ctx.args.count:
            return
        tick.wait(ctx.args.interval)


def _json_out(change: Change) -> None:
    for t in change.transitions:
        event = {"event": "transition", **present.transition_json(t)}
        print(json.dumps({**event, "name": change.names.get(t.task_id)}))
    for s in change.active:
        if s.status in SHOWS_PROGRESS:
            print(json.dumps({"event": "progress", **present.snapshot_json(s, brief=True)}))
    # json.dumps escapes every character past ASCII: nothing here reaches a terminal raw.


def _plain_out(ctx: Context) -> Any:
    """A log: a header and every unfinished task first, then transitions as they come and
    a task's progress at most every ``PROGRESS_EVERY`` seconds."""
    started = [False]
    printed: dict[str, float] = {}

    def out(change: Change) -> None:
        now = time.monotonic()
        shown = change.progressed
        if not started[0]:
            started[0] = True
            head = f"watching {ctx.where()}: {len(change.active)} unfinished; Ctrl-C to leave"
            print(printable(head))
            shown = change.active
        elif change.overflow:
            print(OVERFLOW)
        for t in change.transitions:
            print(transition_line(t, change.names.get(t.task_id, "?")))
        for s in shown:
            if shown is change.active or (
                s.status in SHOWS_PROGRESS and now - printed.get(s.task_id, -1e9) >= PROGRESS_EVERY
            ):
                printed[s.task_id] = now
                print(progress_line(s))

    return out


def _live(ctx: Context, feed: TransitionFeed) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    tick = threading.Event()
    count = 0
    change = feed.poll()
    with Live(_screen(ctx, change), console=console, auto_refresh=False) as live:
        while True:
            count += 1
            if change.overflow:
                live.console.print(OVERFLOW, style="dim", markup=False)
            for t in change.transitions:
                live.console.print(_styled(t, change.names.get(t.task_id, "?")), highlight=False)
            live.update(_screen(ctx, change), refresh=True)
            if ctx.args.count is not None and count >= ctx.args.count:
                return
            tick.wait(ctx.args.interval)
            change = feed.poll()


_STYLE = {
    "succeeded": "green",
    "failed": "bold red",
    "lost": "bold red",
    "stopped": "yellow",
    "cancelled": "yellow",
    "paused": "cyan",
    "running": "blue",
}


def _styled(t: Transition, name: str) -> RenderableType:
    from rich.text import Text

    line = Text(f"{present.clock(t.at)}  ", style="dim")
    line.append(present.short_id(t.task_id), style="magenta")
    line.append(f"  {printable(name)}  ", style="bold")
    line.append(f"{t.from_status.value if t.from_status else 'new'} -> ")
    line.append(t.to_status.value, style=_STYLE.get(t.to_status.value, ""))
    if t.reason:
        line.append(f" ({printable(t.reason)})")
    if t.actor:
        line.append(f" by {printable(t.actor)}", style="dim")
    return line


COLUMNS = ("TASK ID", "NAME", "STATUS", "DONE", "HEALTH", "AGE", "PROGRESS", "MESSAGE")
"""The live table's columns, in the order they are shown."""
DROPPED_FIRST = ("MESSAGE", "PROGRESS", "AGE", "HEALTH", "DONE")
"""The columns left out, in this order, until the rest fit the terminal: a column is
dropped whole, never cut (``runni…`` says nothing). The id, name and status stay."""
BAR = 20


def fitting(widths: dict[str, int], room: int) -> list[str]:
    """The columns of ``COLUMNS`` to show when each needs ``widths[column]`` characters
    (its widest cell or header) and the terminal has ``room``: rich spends three a
    column on padding and rules, and one more on the table's edge."""
    shown = list(COLUMNS)
    for column in DROPPED_FIRST:
        if sum(widths[c] + 3 for c in shown) + 1 <= room:
            break
        shown.remove(column)
    return shown


def _screen(ctx: Context, change: Change) -> RenderableType:
    from rich.console import Console
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    now = Capabilities(ctx.store()).now()
    rows = []
    for s in change.active:
        fraction = s.progress.fraction if s.progress else None
        health = present.health(s, now)
        rows.append(
            {
                "TASK ID": Text(present.short_id(s.task_id), style="magenta"),
                "NAME": Text(printable(s.name)),
                "STATUS": Text(present.status_text(s, now), style=_STYLE.get(s.status.value, "")),
                "DONE": Text("" if fraction is None else f"{fraction:.0%}"),
                "HEALTH": Text(health, style="" if health in ("ok", "-") else "bold red"),
                "AGE": Text(present.age(max(0.0, (now - s.created_at).total_seconds()))),
                "PROGRESS": ProgressBar(total=1.0, completed=fraction, width=BAR)
                if fraction is not None
                else Text(""),
                "MESSAGE": Text(
                    printable(s.progress.message or "") if s.progress else "", overflow="ellipsis"
                ),
            }
        )
    widths = {c: len(c) for c in COLUMNS}
    for row in rows:
        for column, cell in row.items():
            size = len(cell) if isinstance(cell, Text) else BAR
            widths[column] = max(widths[column], size)
    widths["MESSAGE"] = min(widths["MESSAGE"], 12)  # a message may be cut, not hidden first
    shown = fitting(widths, Console().width)
    title = f"watching {ctx.where()}: {len(change.active)} unfinished; Ctrl-C to leave"
    table = Table(title=Text(printable(title)), title_justify="left", expand=False)
    for column in shown:
        table.add_column(
            column,
            no_wrap=True,
            overflow="ellipsis" if column in ("NAME", "MESSAGE") else "fold",
            min_width=widths[column] if column not in ("NAME", "MESSAGE") else None,
        )
    for row in rows:
        table.add_row(*(row[column] for column in shown))
    if not change.active:
        table.caption = "nothing unfinished; transitions appear above as they happen"
    return table
