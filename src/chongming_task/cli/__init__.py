"""The ``chongming-task`` command line: one view of every node's tasks.

Thin by design: parse, validate the bucket flags before anything else (an out-of-range
bucket is an error, never an empty result), call the library, render. One context manager
maps the library's errors to a one-line message and an exit code; no traceback reaches a
user for a user's mistake.

Exit codes: 0 ok, 1 failed (unknown task, store error, wait timed out), 2 bad usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ..controller import Controller
from ..errors import (
    ChongmingTaskError,
    ConfigurationError,
    InvalidValue,
    StoreError,
    WaitTimeout,
)
from ..model import CommandAction, TaskQuery, TaskSnapshot, TaskStatus
from ..policies import DEFAULT_NUM_BUCKETS, BucketPolicy, format_buckets, parse_buckets
from ..states import NON_TERMINAL, SHOWS_PROGRESS, TERMINAL
from ..stores import DEFAULT_DATABASE, is_postgres_dsn, open_store
from ..stores.capabilities import Capabilities
from ..stores.protocol import TaskStore
from . import render

PROG = "chongming-task"


class UsageError(ChongmingTaskError):
    """Bad flags or arguments: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="See and control chongming-task tasks.")
    parser.add_argument(
        "--db",
        default=os.environ.get("CHONGMING_DB", DEFAULT_DATABASE),
        help=f"SQLite file or postgresql:// DSN (env CHONGMING_DB, default {DEFAULT_DATABASE})",
    )
    parser.add_argument(
        "--num-buckets",
        type=int,
        default=None,
        help=f"deployment-wide bucket count (env CHONGMING_NUM_BUCKETS, default "
        f"{DEFAULT_NUM_BUCKETS})",
    )
    parser.add_argument(
        "--owned-buckets",
        default=os.environ.get("CHONGMING_OWNED_BUCKETS"),
        help="this node's buckets, e.g. 0-15,20 (env CHONGMING_OWNED_BUCKETS)",
    )
    parser.add_argument(
        "--pg-schema",
        default=os.environ.get("CHONGMING_PG_SCHEMA"),
        help="PostgreSQL schema (env CHONGMING_PG_SCHEMA, default chongming)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=os.environ.get("CHONGMING_JSON", "") not in ("", "0"),
        help="machine-readable output (env CHONGMING_JSON=1)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--all", action="store_true", help="include finished tasks")
        p.add_argument("--mine", action="store_true", help="only this node's buckets")
        p.add_argument("--status", action="append", choices=[s.value for s in TaskStatus])
        p.add_argument("--name")
        p.add_argument("--tag")
        p.add_argument("--bucket", action="append", type=int)
        p.add_argument("--pipeline")
        p.add_argument("--limit", type=int)

    p = sub.add_parser("ps", help="list tasks (active ones unless --all)")
    filters(p)
    p = sub.add_parser("show", help="one task: snapshot, progress, failure")
    p.add_argument("task_id")
    p = sub.add_parser("history", help="one task's transitions")
    p.add_argument("task_id")
    p.add_argument("--since", type=int, default=0, metavar="VERSION")
    p = sub.add_parser("watch", help="follow changes live")
    filters(p)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--count", type=int, default=None, help="stop after N refreshes")
    sub.add_parser("stats", help="tasks per status")
    p = sub.add_parser("buckets", help="tasks per bucket; * marks owned buckets")
    p.add_argument("--all", action="store_true", help="list empty buckets too")
    for action in CommandAction:
        p = sub.add_parser(action.value, help=f"{action.value} a task (request accepted)")
        p.add_argument("task_id")
        p.add_argument("--reason")
        p.add_argument(
            "--wait",
            nargs="?",
            type=float,
            const=30.0,
            default=None,
            metavar="SECONDS",
            help="wait for the outcome (default 30 s)",
        )
    p = sub.add_parser("reconcile", help="mark tasks of dead nodes lost (owned buckets)")
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("prune", help="delete the oldest finished tasks")
    p.add_argument("--keep", type=int, required=True, metavar="N")
    sub.add_parser("migrate", help="create the store's schema (needs DDL rights once)")
    p = sub.add_parser("demo", help="run a demo node with sample tasks")
    p.add_argument("--duration", type=float, default=300.0)
    return parser


class Context:
    """What every command needs: validated buckets and a lazily opened store."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        num = args.num_buckets
        if num is None:
            num = _env_int("CHONGMING_NUM_BUCKETS", DEFAULT_NUM_BUCKETS)
        try:
            self.policy = BucketPolicy(num)
            self.owned: frozenset[int] | None = (
                None if not args.owned_buckets else parse_buckets(args.owned_buckets, num)
            )
            for option in ("bucket",):
                values = getattr(args, option, None)
                if values:
                    self.policy.validate(values)
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
        self._store: TaskStore | None = None

    @property
    def db(self) -> str:
        return str(self.args.db)

    @property
    def shown_db(self) -> str:
        """The --db value safe to print (a DSN's password is never echoed)."""
        if is_postgres_dsn(self.db):
            return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", self.db)
        return self.db

    def store(self, *, create: bool = False) -> TaskStore:
        if self._store is None:
            self._store = open_store(self.db, create=create, schema=self.args.pg_schema)
        return self._store

    def controller(self, *, owned: bool = False) -> Controller:
        return Controller(
            self.store(),
            owner=f"cli:{socket.gethostname()}:{os.getpid()}",
            num_buckets=self.policy.num_buckets,
            owned_buckets=self.owned if owned else None,
            poll_commands=False,  # an operator tool acts for nodes; it never takes commands
        )

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def emit(self, data: Any, text: str) -> None:
        print(json.dumps(data, ensure_ascii=False, indent=2) if self.args.json else text)


def _query(ctx: Context) -> TaskQuery:
    a = ctx.args
    buckets: frozenset[int] | None = frozenset(a.bucket) if a.bucket else None
    if a.mine:
        if ctx.owned is None:
            raise UsageError("--mine needs --owned-buckets (or CHONGMING_OWNED_BUCKETS)")
        buckets = ctx.owned if buckets is None else buckets & ctx.owned
    statuses: frozenset[TaskStatus] | None = None
    if a.status:
        statuses = frozenset(TaskStatus(s) for s in a.status)
    elif not a.all:
        statuses = NON_TERMINAL
    if a.limit is not None and a.limit < 0:
        raise UsageError("--limit must be >= 0")
    return TaskQuery(
        statuses=statuses,
        name=a.name,
        tag=a.tag,
        buckets=buckets,
        pipeline_run_id=a.pipeline,
        limit=a.limit,
        newest_first=True,
    )


def _get(ctx: Context, task_id: str) -> TaskSnapshot:
    snapshot = ctx.store().get(task_id)
    if snapshot is None:
        raise LookupError(f"no task {task_id} in {ctx.shown_db}")
    return snapshot


# -- commands ---------------------------------------------------------------------------------


def cmd_ps(ctx: Context) -> int:
    snapshots = ctx.store().query(_query(ctx))
    headers, rows = render.ps_rows(snapshots)
    ctx.emit([render.snapshot_json(s) for s in snapshots], render.table(headers, rows))
    return 0


def cmd_show(ctx: Context) -> int:
    snapshot = _get(ctx, ctx.args.task_id)
    ctx.emit(render.snapshot_json(snapshot), render.show_text(snapshot))
    return 0


def cmd_history(ctx: Context) -> int:
    _get(ctx, ctx.args.task_id)
    trail = ctx.store().history(ctx.args.task_id, since_version=ctx.args.since)
    headers, rows = render.history_rows(trail)
    ctx.emit([render.transition_json(t) for t in trail], render.table(headers, rows))
    return 0


def cmd_watch(ctx: Context) -> int:
    """Print each new transition once (incrementally, via ``since_version``), then the
    progress of what is running; repeat every ``--interval`` seconds."""
    store = ctx.store()
    query = _query(ctx)
    seen: dict[str, int] = {}
    first = True
    tick = threading.Event()
    count = 0
    while ctx.args.count is None or count < ctx.args.count:
        count += 1
        snapshots = store.query(query)
        events = []
        for s in snapshots:
            last = seen.get(s.task_id)
            if last is None and first:
                seen[s.task_id] = s.status_version  # start from now, not from the past
                continue
            if last != s.status_version:
                events += store.history(s.task_id, since_version=last or 0)
                seen[s.task_id] = s.status_version
        first = False
        events.sort(key=lambda t: t.at)
        running = [s for s in snapshots if s.status in SHOWS_PROGRESS]
        if ctx.args.json:
            for t in events:
                print(json.dumps({"event": "transition", **render.transition_json(t)}))
            for s in running:
                print(json.dumps({"event": "progress", **render.snapshot_json(s)}))
        else:
            for t in events:
                source = t.from_status.value if t.from_status else "new"
                why = f" ({t.reason})" if t.reason else ""
                print(f"{render.ts(t.at)}  {t.task_id}  {source} -> {t.to_status.value}{why}")
            for s in running:
                print(f"    {s.task_id}  {s.name:16} {s.status.value:8} {render.bar(s)}")
        sys.stdout.flush()
        if ctx.args.count is not None and count >= ctx.args.count:
            break
        tick.wait(ctx.args.interval)
    return 0


def cmd_stats(ctx: Context) -> int:
    counts = ctx.store().counts()
    full = {s.value: counts.get(s, 0) for s in TaskStatus}
    rows = [[status, str(n)] for status, n in full.items()]
    rows.append(["total", str(sum(full.values()))])
    ctx.emit(full, render.table(["STATUS", "TASKS"], rows))
    return 0


def cmd_buckets(ctx: Context) -> int:
    counts: dict[int | None, int] = {}
    for s in ctx.store().query():
        counts[s.bucket] = counts.get(s.bucket, 0) + 1
    owned = ctx.owned
    shown = (
        range(ctx.policy.num_buckets)
        if ctx.args.all
        else sorted({b for b in counts if b is not None} | (owned or set()))
    )

    def mine(b: int) -> bool:
        return owned is None or b in owned

    data = {
        "num_buckets": ctx.policy.num_buckets,
        "owned": None if owned is None else format_buckets(owned),
        "buckets": [{"bucket": b, "tasks": counts.get(b, 0), "owned": mine(b)} for b in shown],
        "unbucketed": counts.get(None, 0),
    }
    rows = [
        [f"{b}{'*' if owned is not None and b in owned else ''}", str(counts.get(b, 0))]
        for b in shown
    ]
    if counts.get(None):
        rows.append(["-", str(counts[None])])
    note = "" if owned is None else "\n* owned by this node"
    ctx.emit(data, render.table(["BUCKET", "TASKS"], rows) + note)
    return 0


_WAIT_UNTIL = {
    CommandAction.STOP: lambda s: s.status in TERMINAL,
    CommandAction.CANCEL: lambda s: s.status in TERMINAL,
    CommandAction.PAUSE: lambda s: s.status is TaskStatus.PAUSED or s.status in TERMINAL,
    CommandAction.RESUME: lambda s: s.status is not TaskStatus.PAUSED,
}


def cmd_control(ctx: Context) -> int:
    action = CommandAction(ctx.args.command)
    task_id = ctx.args.task_id
    controller = ctx.controller()
    try:
        receipt = getattr(controller, action.value)(task_id, reason=ctx.args.reason)
        data: dict[str, Any] = {
            "task_id": task_id,
            "action": action.value,
            "outcome": receipt.outcome,
            "command_id": receipt.command_id,
        }
        if receipt.accepted:
            text = (
                f"{action.value} {task_id}: request accepted (command {receipt.command_id}); "
                f"the node holding it acts at its next poll.\n"
                f"check with: {PROG} --db {ctx.shown_db} show {task_id}"
            )
        else:
            text = f"{action.value} {task_id}: {receipt.outcome}"
        if ctx.args.wait is not None and receipt.accepted:
            final = controller.wait_for(task_id, _WAIT_UNTIL[action], timeout=ctx.args.wait)
            data["status"] = final.status.value
            text += f"\nnow {final.status.value}"
        ctx.emit(data, text)
        return 0
    finally:
        controller.close()


def cmd_reconcile(ctx: Context) -> int:
    controller = ctx.controller(owned=True)
    try:
        report = controller.reconcile(dry_run=ctx.args.dry_run)
    finally:
        controller.close()
    scope = "all buckets" if ctx.owned is None else f"buckets {format_buckets(ctx.owned)}"
    verb = "would mark" if report.dry_run else "marked"
    lines = [f"reconcile ({scope}): {verb} {len(report.lost)} task(s) lost"]
    lines += [f"  {t}" for t in report.lost]
    if report.let_go:
        lines.append(f"let go of {len(report.let_go)} task(s) whose supervisor came back")
    ctx.emit(
        {
            "dry_run": report.dry_run,
            "scope": None if ctx.owned is None else format_buckets(ctx.owned),
            "lost": list(report.lost),
            "let_go": list(report.let_go),
        },
        "\n".join(lines),
    )
    return 0


def cmd_prune(ctx: Context) -> int:
    if ctx.args.keep < 0:
        raise UsageError("--keep must be >= 0")
    pruned = ctx.store().prune(keep_terminal=ctx.args.keep)
    ctx.emit({"pruned": pruned}, f"pruned {pruned} finished task(s) and their history")
    return 0


def cmd_migrate(ctx: Context) -> int:
    """Create the schema. SQLite creates its tables when opened; Postgres needs this once,
    run by a role with DDL rights, so that nodes and the CLI can run without them."""
    made = Capabilities(ctx.store(create=True)).create_schema()
    where, schema = made if made is not None else (ctx.shown_db, None)
    ctx.emit(
        {"store": where, "schema": schema, "ready": True},
        f"schema ready at {where}" + (f" (schema {schema})" if schema else ""),
    )
    return 0


def cmd_demo(ctx: Context) -> int:
    from ..demo import run_node

    return run_node(ctx.store(create=True), ctx.shown_db, ctx.args.duration)


COMMANDS = {
    "ps": cmd_ps,
    "show": cmd_show,
    "history": cmd_history,
    "watch": cmd_watch,
    "stats": cmd_stats,
    "buckets": cmd_buckets,
    "stop": cmd_control,
    "pause": cmd_control,
    "resume": cmd_control,
    "cancel": cmd_control,
    "reconcile": cmd_reconcile,
    "prune": cmd_prune,
    "migrate": cmd_migrate,
    "demo": cmd_demo,
}


@contextlib.contextmanager
def errors_mapped(exit_code: list[int]) -> Iterator[None]:
    """The one place that turns exceptions into a message line and an exit code."""

    def fail(code: int, message: str) -> None:
        print(f"{PROG}: error: {message}", file=sys.stderr)
        exit_code[0] = code

    try:
        yield
    except (UsageError, InvalidValue) as exc:
        fail(2, str(exc))
    except (LookupError, WaitTimeout, StoreError, ChongmingTaskError) as exc:
        fail(1, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        fail(130, "interrupted")
    except BrokenPipeError:
        exit_code[0] = 0  # e.g. piped into head


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse an argument (or environment default) that is not UTF-8 text: Python turns
    undecodable bytes into lone surrogates that no store can hold or match."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    flag = name.upper() if name == "task_id" else "--" + name.replace("_", "-")
                    raise UsageError(
                        f"{flag} {item!a} is not valid UTF-8 text (check the terminal's "
                        "or the environment's encoding)"
                    ) from None


def main(argv: Sequence[str] | None = None) -> int:
    # The pool logs each failed connection attempt; the one-line error says it already.
    driver_log = logging.getLogger("psycopg")
    driver_log.addHandler(logging.NullHandler())
    driver_log.propagate = False
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    code = [0]
    ctx: Context | None = None
    with errors_mapped(code):
        args = build_parser().parse_args(argv)
        _check_text_arguments(args)
        ctx = Context(args)  # bucket flags are validated here, before anything else
        try:
            code[0] = COMMANDS[args.command](ctx)
        finally:
            ctx.close()
    return code[0]


def run() -> None:
    sys.exit(main())


__all__ = ["build_parser", "main", "run"]
