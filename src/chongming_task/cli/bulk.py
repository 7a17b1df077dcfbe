"""``stop|pause|resume|cancel`` with a selection instead of an id: every unfinished task
the flags of ``ps`` pick (``--all`` or a finished ``--status`` adds none: a finished task
has nothing to control), each sent its own control, one task's failure never keeping
the rest from theirs.

On a terminal the command asks first ("stop 37 tasks? [y/N]"); off a terminal, a
selection of more than one task needs ``--yes``. ``--dry-run`` lists the selection and
sends nothing. The answer counts each outcome."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from typing import Any

from .. import present
from ..errors import ChongmingTaskError
from ..model import CommandAction, ControlOutcome, ControlReceipt, TaskSnapshot
from ..states import NON_TERMINAL
from .context import Context, find_tasks, holds_of, task_queries
from .parser import PROG, UsageError

__all__ = ["SELECTION_FLAGS", "cmd_bulk_control", "outcome_label"]

SELECTION_FLAGS = (
    "all",
    "mine",
    "status",
    "name",
    "tag",
    "bucket",
    "pipeline",
    "node",
    "dedupe_key",
    "older_than",
    "limit",
)
"""The flags a control shares with ``ps``: any of them set makes it a selection."""

FAILED = "failed"


def outcome_label(receipt: ControlReceipt) -> str:
    """A control's outcome as counted: ``request accepted``, ``already finished``..."""
    if receipt.accepted:
        return "request accepted"
    if receipt.outcome is ControlOutcome.ALREADY_TERMINAL:
        return "already finished"
    return str(receipt.outcome).replace("-", " ")


def cmd_bulk_control(ctx: Context, action: CommandAction) -> int:
    a = ctx.args
    if a.wait is not None:
        raise UsageError("--wait follows one task: give its id (a selection answers at once)")
    queries = task_queries(ctx)
    asked = queries[0].statuses  # the same in each
    # Only unfinished tasks can be controlled: --all or a finished --status selects
    # none of the finished ones (a count including them would say more than is sent).
    unfinished = NON_TERMINAL if asked is None else asked & NON_TERMINAL
    if not unfinished:
        raise UsageError(
            f"{action.value} acts on unfinished tasks only: --status "
            f"{','.join(sorted(s.value for s in asked or ()))} selects none"
        )
    # Held ones with paused.
    chosen = find_tasks(ctx, [replace(query, statuses=unfinished) for query in queries])
    verb = action.value
    if a.dry_run or not chosen:
        headers, rows = present.ps_rows(chosen, ctx.now(), holds_of(ctx, chosen))
        what = f"would {verb} {len(chosen)} task(s); nothing sent" if chosen else "no task matches"
        ctx.emit(
            {"action": verb, "dry_run": a.dry_run, "selected": len(chosen), "tasks": [
                s.task_id for s in chosen
            ]},
            (present.table(headers, rows) + "\n" if chosen else "") + what,
        )  # fmt: skip
        return 0
    if not a.yes and not _confirmed(verb, len(chosen)):
        ctx.emit({"action": verb, "selected": len(chosen), "sent": 0}, "nothing sent")
        return 1
    return _send_each(ctx, action, chosen)


def _confirmed(verb: str, count: int) -> bool:
    """Asked on a terminal; off one, one task goes without asking and more need --yes."""
    if not sys.stdin.isatty():
        if count > 1:
            raise UsageError(
                f"{verb} would act on {count} tasks: add --yes to go ahead (--dry-run lists them)"
            )
        return True
    print(f"{verb} {count} task(s)? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        return False
    return answer.strip().lower() in ("y", "yes")


def _send_each(ctx: Context, action: CommandAction, chosen: list[TaskSnapshot]) -> int:
    control = ctx.control()
    counts: Counter[str] = Counter()
    each: list[dict[str, Any]] = []
    failures: list[str] = []
    interrupted = False
    for snapshot in chosen:
        try:
            receipt = control.send(snapshot.task_id, action, ctx.args.reason)
        except ChongmingTaskError as exc:  # this task's; the rest still get theirs
            counts[FAILED] += 1
            failures.append(f"  {snapshot.task_id}: {exc}")
            each.append({"task_id": snapshot.task_id, "outcome": FAILED, "error": str(exc)})
            continue
        except KeyboardInterrupt:
            interrupted = True
            break
        label = outcome_label(receipt)
        counts[label] += 1
        each.append(
            {
                "task_id": snapshot.task_id,
                "outcome": label,
                "command_id": receipt.command_id,
                "status": None if receipt.status is None else receipt.status.value,
            }
        )
    summary = ", ".join(f"{n} {label}" for label, n in counts.most_common())
    head = f"{action.value} {len(chosen)} task(s): {summary or 'none sent'}"
    if interrupted:
        head += f" (interrupted after {len(each)} of {len(chosen)}; the rest were not sent)"
    ctx.emit(
        {
            "action": action.value,
            "selected": len(chosen),
            "outcomes": dict(counts),
            "tasks": each,
            "interrupted": interrupted,
        },
        "\n".join([head, *failures]),
    )
    if interrupted:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 1 if failures else 0
