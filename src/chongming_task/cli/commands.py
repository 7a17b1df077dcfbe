"""One function per subcommand: call the library with what the context validated, and
render the answer as a table or JSON."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import fleet, present
from ..errors import ConfigurationError, StoreError, WaitTimeout
from ..model import CommandAction, ControlReceipt, TaskSnapshot, TaskStatus
from ..node.signals import NotedSignals
from ..policies import format_buckets
from ..states import NON_TERMINAL, TERMINAL
from ..stores import is_postgres_dsn, open_store
from ..stores.capabilities import Capabilities
from .bulk import SELECTION_FLAGS, cmd_bulk_control
from .context import Context, find_tasks, get_task, holds_of, task_queries
from .parser import PROG, UsageError
from .prune import cmd_prune
from .watch import cmd_watch

if TYPE_CHECKING:
    from ..control import StoreControl

__all__ = ["COMMANDS"]


PS_SHOWN = 100
"""The tasks ``ps`` lists without ``--limit`` (newest first); a line says how many more."""


def cmd_ps(ctx: Context) -> int:
    shown = PS_SHOWN if ctx.args.limit is None else ctx.args.limit  # 0: all of them
    if shown:
        ctx.args.limit = shown + 1  # one more: whether there are more
    snapshots = find_tasks(ctx)
    more = ""
    if shown and len(snapshots) > shown:
        snapshots = snapshots[:shown]
        total = _count(ctx)
        past = "more" if total is None else f"{total - shown:,} more"
        more = (
            f"... and {past} (the newest {shown:,} are shown): --limit N for more, "
            "--limit 0 for all, or narrow with --status, --name, --older-than..."
        )
    now = ctx.now()
    held = holds_of(ctx, snapshots)
    headers, rows = present.ps_rows(snapshots, now, held)
    ctx.emit(
        [
            {
                **present.snapshot_json(s, brief=True),
                **present.health_json(s, now),
                "held_since": present.ts(held.get(s.task_id)),
            }
            for s in snapshots
        ],
        present.table(headers, rows) + (f"\n{more}" if more else ""),
    )
    if more and ctx.args.json:
        print(f"{PROG}: {more}", file=sys.stderr)
    return 0


def _count(ctx: Context) -> int | None:
    """How many tasks the selection holds, where one count of the store answers it (a
    selection by status and bucket only); ``None`` otherwise."""
    a, (query, *_) = ctx.args, task_queries(ctx)
    narrowed = (a.name, a.tag, a.carrier, a.pipeline, a.node, a.dedupe_key, a.older_than)
    if any(value is not None for value in narrowed):
        return None
    pairs = Capabilities(ctx.store()).count_tasks("bucket_status", statuses=query.statuses)
    return sum(
        n for (bucket, _), n in pairs.items() if query.buckets is None or bucket in query.buckets
    )


def cmd_show(ctx: Context) -> int:
    snapshot = get_task(ctx, ctx.args.task_id)
    caps = Capabilities(ctx.store())
    now = caps.now()
    late = next(iter(caps.late_reports(task_ids=[snapshot.task_id])), None)
    held = holds_of(ctx, [snapshot]).get(snapshot.task_id)
    suspended = _suspended(ctx, snapshot)
    ctx.emit(
        {
            **present.snapshot_json(snapshot),
            **present.health_json(snapshot, now),
            "held_since": present.ts(held),
            "carrier": present.carrier(snapshot),
            "suspended": suspended,
            "late_report": None if late is None else present.late_report_json(late),
        },
        present.show_text(snapshot, now, late, held, suspended),
    )
    return 0


def _suspended(ctx: Context, snapshot: TaskSnapshot) -> str | None:
    """The trail's word on a paused process task whose worker a pause stopped (its pid):
    ``None`` for any other task. One more read, for paused process tasks only."""
    if snapshot.status is not TaskStatus.PAUSED or present.carrier(snapshot) != "process":
        return None
    since = snapshot.status_version - 1
    return present.suspended(snapshot, ctx.store().history(snapshot.task_id, since_version=since))


def cmd_history(ctx: Context) -> int:
    task_id = get_task(ctx, ctx.args.task_id).task_id
    store = ctx.store()
    trail = store.history(task_id, since_version=ctx.args.since)
    headers, rows = present.history_rows(trail)
    text = present.table(headers, rows)
    late = next(iter(Capabilities(store).late_reports(task_ids=[task_id])), None)
    if late is not None:  # beside the trail, never in it: the store's status stands
        text += f"\nlate report: {late.summary()}"
    ctx.emit([present.transition_json(t) for t in trail], text)
    return 0


def cmd_stats(ctx: Context) -> int:
    counts = ctx.store().counts()
    full = {s.value: counts.get(s, 0) for s in TaskStatus}
    rows = [[status, str(n)] for status, n in full.items()]
    rows.append(["total", str(sum(full.values()))])
    ctx.emit(full, present.table(["STATUS", "TASKS"], rows))
    return 0


def cmd_buckets(ctx: Context) -> int:
    """Tasks per bucket: the unfinished per status, the finished together. Two
    ``GROUP BY``s the indexes answer (a per-status split of the finished would read every
    finished row: seconds at a million tasks)."""
    caps = Capabilities(ctx.store())
    totals: dict[int | None, int] = caps.count_tasks("bucket")
    pairs: dict[tuple[int | None, TaskStatus], int] = caps.count_tasks(
        "bucket_status", statuses=NON_TERMINAL
    )
    per = present.by_bucket(pairs)
    owned = ctx.owned
    shown = (
        range(ctx.policy.num_buckets)
        if ctx.args.all
        else sorted({b for b in totals if b is not None} | (owned or set()))
    )
    seen = [status for status in TaskStatus if any(status in c for c in per.values())]

    def mine(b: int) -> bool:
        return owned is None or b in owned

    def entry(bucket: int | None) -> dict[str, Any]:
        found = per.get(bucket, {})
        total = totals.get(bucket, 0)
        return {
            "tasks": total,
            "unfinished": {status.value: n for status, n in found.items()},
            "finished": total - sum(found.values()),
        }

    data = {
        "num_buckets": ctx.policy.num_buckets,
        "owned": None if owned is None else format_buckets(owned),
        "buckets": [{"bucket": b, **entry(b), "owned": mine(b)} for b in shown],
        "unbucketed": entry(None),
    }

    def row(label: str, bucket: int | None) -> list[str]:
        counts = entry(bucket)
        unfinished = [str(per.get(bucket, {}).get(s, 0)) for s in seen]
        return [label, str(counts["tasks"]), *unfinished, str(counts["finished"])]

    rows = [row(f"{b}{'*' if owned is not None and b in owned else ''}", b) for b in shown]
    if None in totals:
        rows.append(row("-", None))
    headers = ["BUCKET", "TASKS", *(status.value.upper() for status in seen), "FINISHED"]
    note = "" if owned is None else "\n* owned by this node"
    ctx.emit(data, present.table(headers, rows) + note)
    return 0


_WAIT_UNTIL = {
    CommandAction.STOP: lambda s: s.status in TERMINAL,
    CommandAction.CANCEL: lambda s: s.status in TERMINAL,
    CommandAction.PAUSE: lambda s: s.status is TaskStatus.PAUSED or s.status in TERMINAL,
    CommandAction.RESUME: lambda s: s.status is not TaskStatus.PAUSED,
}


class _CtrlCHeld(NotedSignals):
    """Ctrl-C while a control request is being written is held until the write has
    ended (``release``), so whoever pressed it hears whether the request was accepted
    and stays queued, not a bare "interrupted" that leaves them guessing. A second
    Ctrl-C interrupts at once. Only on the main thread (where signals are handled)."""

    def __init__(self) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        super().__init__(install=on_main, signals=(signal.SIGINT,))

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.caught:
            raise KeyboardInterrupt
        super()._note(signum, frame)

    def release(self) -> None:
        """Ctrl-C interrupts again; raises ``KeyboardInterrupt`` if it was pressed."""
        self.restore()
        if self.caught:
            raise KeyboardInterrupt


def cmd_control(ctx: Context) -> int:
    action = CommandAction(ctx.args.command)
    picked = [f"--{f.replace('_', '-')}" for f in SELECTION_FLAGS if getattr(ctx.args, f)]
    if ctx.args.task_id is None:
        if not picked:
            raise UsageError(
                f"{action.value} needs a task id, or a selection as ps takes (--name, "
                "--status, --tag, --bucket, --node, --pipeline, --older-than)"
            )
        return cmd_bulk_control(ctx, action)
    if picked or ctx.args.dry_run or ctx.args.yes:
        extra = picked or ["--dry-run" if ctx.args.dry_run else "--yes"]
        raise UsageError(f"give a task id or a selection, not both ({' '.join(extra)})")
    task_id = get_task(ctx, ctx.args.task_id).task_id
    with _CtrlCHeld() as ctrl_c:
        return _control(ctx, ctx.control(), action, task_id, ctrl_c)


def _control(
    ctx: Context, control: StoreControl, action: CommandAction, task_id: str, ctrl_c: _CtrlCHeld
) -> int:
    """``cmd_control`` once the task is found, Ctrl-C held until the request is written."""
    receipt = control.send(task_id, action, ctx.args.reason)
    data: dict[str, Any] = {
        "task_id": task_id,
        "action": action.value,
        "outcome": receipt.outcome,
        "command_id": receipt.command_id,
        "status": None if receipt.status is None else receipt.status.value,
        "behind": None if receipt.behind is None else receipt.behind.value,
    }
    head = f"{action.value} {task_id}: {present.control_outcome(receipt)}"
    if ctx.args.wait is None or (not receipt.accepted and receipt.status in (None, *TERMINAL)):
        more = f"\ncheck with: {ctx.command_line('show', task_id)}" if receipt.accepted else ""
        ctx.emit(data, head + more)
        ctrl_c.release()
        return 0
    effect = _WAIT_UNTIL[action]
    if receipt.accepted:
        head = f"{action.value} {task_id}: request accepted (command {receipt.command_id})"
        effect, said = _carried_out(control, receipt, effect), f"{head} and stays queued"
    else:  # already on its way (pausing, stopping): --wait still waits for the effect
        said = head
    try:
        ctrl_c.release()  # a Ctrl-C held meanwhile is heard here
        final = control.wait_for(task_id, effect, timeout=ctx.args.wait)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{said}; {exc}") from None
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: {said}", file=sys.stderr)
        return 130
    data["status"] = final.status.value
    ctx.emit(data, f"{head}; now {final.status.value}")
    return 0


def _carried_out(
    control: StoreControl, receipt: ControlReceipt, effect: Callable[[TaskSnapshot], bool]
) -> Callable[[TaskSnapshot], bool]:
    """``effect`` of an accepted command, looked for only once its holder has carried it
    out (a resume queued behind a pending pause must not count the status before it)."""
    caps = Capabilities(control.store)

    def done(snapshot: TaskSnapshot) -> bool:
        if snapshot.is_terminal:
            return True
        pending = caps.commands.pending(snapshot.task_id)
        if pending is not None and any(c.command_id == receipt.command_id for c in pending):
            return False
        return effect(snapshot)

    return done


def cmd_reconcile(ctx: Context) -> int:
    controller = ctx.controller()
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


def cmd_nodes(ctx: Context) -> int:
    caps = Capabilities(ctx.store())
    if not caps.has_fleet_registry:
        raise StoreError(f"{ctx.shown_db}: this store keeps no node declarations")
    nodes = fleet.node_statuses(caps, caps.now())
    headers, rows = present.nodes_rows(nodes)
    text = present.table(headers, rows) if nodes else "no node has declared itself yet"
    ctx.emit([present.node_json(n) for n in nodes], text)
    return 0


def cmd_schedules(ctx: Context) -> int:
    """One row a schedule, however many nodes define it: those nodes, its trigger, the
    next slot, the last firing, its task's status and the node that ran it, and whether
    it can fire at all (a node that defines it live, dead or stopped)."""
    store = ctx.store()
    caps = Capabilities(store)
    if not caps.has_fleet_registry:
        raise StoreError(f"{ctx.shown_db}: this store keeps no schedule records")
    now = caps.now()
    nodes = {n.node: n for n in caps.nodes()}
    rows, data = [], []
    for s in present.fleet_schedules(caps.schedules()):
        fired = s.last
        last_id = None if fired is None else fired.last_task_id
        last = None if last_id is None else store.get(last_id)
        rows.append(present.schedule_row(s, nodes, last, now))
        data.append(present.schedule_json(s, nodes, last, now))
    text = (
        present.table(present.SCHEDULE_HEADERS, rows)
        if rows
        else "no schedules: a node records its schedules here while it runs"
    )
    ctx.emit(data, text)
    return 0


DOCTOR_ALARMED = 3
"""``doctor``'s exit code when an alarm fires (1 is kept for "could not check")."""


def cmd_doctor(ctx: Context) -> int:
    a = ctx.args
    for flag, value in (("--orphan-after", a.orphan_after), ("--stale-after", a.stale_after)):
        if value <= 0:
            raise UsageError(f"{flag} must be > 0 seconds")
    report = fleet.examine(
        ctx.store(),
        num_buckets=ctx.policy.num_buckets if ctx.num_buckets_given else None,
        orphan_after=a.orphan_after,
        stale_after=a.stale_after,
        limit=a.limit,
    )
    ctx.emit(
        {
            "healthy": report.healthy,
            "checked_at": present.ts(report.checked_at),
            "num_buckets": report.num_buckets,
            "node_registry": report.registry,
            "nodes": [present.node_json(n) for n in report.nodes],
            "alarms": [present.alarm_json(alarm) for alarm in report.alarms],
        },
        present.doctor_text(report),
    )
    return 0 if report.healthy else DOCTOR_ALARMED


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


def cmd_web(ctx: Context) -> int:
    """Serve the dashboard until Ctrl-C. Off loopback, only with an access token."""
    a = ctx.args
    if not 0 < a.port < 65536:
        raise UsageError("--port must be 1-65535")
    try:
        import uvicorn

        from ..web import Dashboard, create_app
        from ..web.access import answered_hosts, trusted_proxies
    except ImportError as exc:
        raise UsageError(
            f'the dashboard needs the [web] extra: pip install "chongming-task[web]" ({exc.name})'
        ) from None
    token = a.token if a.token_file is None else _read_token(a.token_file)
    try:
        allowed = answered_hosts(a.host, token, a.allowed_host)
        proxies = trusted_proxies(a.trusted_proxy, token)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    # First: its errors are the ones to show. On PostgreSQL one pooled connection (the
    # pages' short reads and the follower's take turns on it) and the LISTEN one: the 2
    # the README budgets for a dashboard; the server names them by this process.
    store = ctx.store(pool_size=1, application_name=f"chongming-task web:{os.getpid()}")
    aside = (
        None
        if is_postgres_dsn(ctx.db)
        else open_store(
            ctx.db,
            schema=a.pg_schema,
            create=False,
            upgrade=False,
            durability=a.sqlite_durability,
        )
    )
    dashboard = Dashboard(
        store,
        where=ctx.where(),
        num_buckets=ctx.policy.num_buckets if ctx.num_buckets_given else None,
        read_only=a.read_only,
        token=token or None,
        allowed_hosts=allowed,
        aside=aside,  # SQLite: a second connection for the whole-store reads
    )
    where = f"http://{a.host}:{a.port}/"
    print(f"dashboard for {ctx.where()} at {where}; Ctrl-C to stop", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(dashboard),
            host=a.host,
            port=a.port,
            log_level="warning",
            timeout_graceful_shutdown=5,
            # Forwarding headers are believed from the proxies named, from nobody else
            # (uvicorn's default believes 127.0.0.1's).
            proxy_headers=bool(proxies),
            forwarded_allow_ips=proxies or None,
        )
    )
    dashboard.closing = lambda: server.should_exit  # open event streams end at a stop
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how one stops it
            server.run()
    finally:
        if aside is not None:
            aside.close()
    return 0


def _read_token(path: str) -> str:
    """The token in ``path``'s first line (``UsageError`` if it cannot be read or is
    blank)."""
    try:
        with open(path, encoding="utf-8") as file:
            token = file.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--token-file {path}: {exc}") from None
    if not token.strip():
        raise UsageError(f"--token-file {path}: its first line is blank")
    return token


def cmd_demo(ctx: Context) -> int:
    from .demo import run_node

    if ctx.args.duration is not None and ctx.args.duration <= 0:
        raise UsageError("--duration must be > 0 seconds")
    return run_node(ctx.store(create=True), ctx.where(), ctx.command_line, ctx.args.duration)


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
    "nodes": cmd_nodes,
    "schedules": cmd_schedules,
    "doctor": cmd_doctor,
    "prune": cmd_prune,
    "migrate": cmd_migrate,
    "web": cmd_web,
    "demo": cmd_demo,
}
