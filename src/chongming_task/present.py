"""How a task, a transition, a node, a schedule and an alarm are shown: table rows, text
and JSON, shared by the CLI and the dashboard. Nothing here touches a store."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .fleet import Alarm, FleetReport, NodeStatus, lease_expired
from .late import LateReport
from .model import (
    CommandAction,
    ControlOutcome,
    ControlReceipt,
    NodeRecord,
    ScheduleRecord,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from .policies import format_buckets
from .states import WAITING
from .text import printable

__all__ = [
    "SCHEDULE_HEADERS",
    "SHORT_ID",
    "FleetSchedule",
    "age",
    "alarm_json",
    "bar",
    "by_bucket",
    "control_outcome",
    "doctor_text",
    "fleet_schedules",
    "health",
    "health_json",
    "history_rows",
    "node_json",
    "node_state",
    "nodes_rows",
    "ps_rows",
    "schedule_json",
    "schedule_row",
    "schedule_state",
    "short_id",
    "show_text",
    "snapshot_json",
    "table",
    "took",
    "transition_json",
    "ts",
]


def ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def snapshot_json(s: TaskSnapshot, *, brief: bool = False) -> dict[str, Any]:
    """A task as JSON. ``brief``: as a list read it (``TaskQuery.brief``), so without
    ``outcome`` or a failure's ``traceback``, which such a read may have left out, and
    with a progress message perhaps cut: ``show --json`` has them whole."""
    data: dict[str, Any] = {
        "task_id": s.task_id,
        "name": s.name,
        "status": s.status.value,
        "status_version": s.status_version,
        "attempt": s.attempt,
        "tags": sorted(s.tags),
        "bucket": s.bucket,
        "bucket_key": s.bucket_key,
        "pipeline_run_id": s.pipeline_run_id,
        "owner": s.owner,
        "created_at": ts(s.created_at),
        "started_at": ts(s.started_at),
        "ended_at": ts(s.ended_at),
        "last_heartbeat_at": ts(s.last_heartbeat_at),
        "run_at": ts(s.run_at),
        "priority": s.priority,
        "dedupe_key": s.dedupe_key,
        "dedupe_window": s.dedupe_window,
        "concurrency_key": s.concurrency_key,
        "trace_context": s.trace_context,
        "progress": None
        if s.progress is None
        else {
            "current": s.progress.current,
            "total": s.progress.total,
            "message": s.progress.message,
            "fraction": s.progress.fraction,
        },
        "failure": None
        if s.failure is None
        else {
            "kind": s.failure.kind.value,
            "message": s.failure.message,
            "exception_type": s.failure.exception_type,
            "carrier_may_run": s.failure.carrier_may_run,
            **({} if brief else {"traceback": s.failure.traceback}),
        },
        "lease_owner": s.lease_owner,
        "lease_until": ts(s.lease_until),
    }
    if not brief:
        data["outcome"] = s.outcome
    return data


def transition_json(t: Transition) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "version": t.version,
        "from": t.from_status.value if t.from_status else None,
        "to": t.to_status.value,
        "at": ts(t.at),
        "reason": t.reason,
        "actor": t.actor,
    }


def bar(s: TaskSnapshot, width: int = 16) -> str:
    fraction = s.progress.fraction if s.progress else None
    if fraction is None:
        return ""
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Rows under headers, in columns; a cell's control characters are shown escaped
    (a name is anybody's text: it must not move the cursor or split the row)."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def age(seconds: float) -> str:
    """``75.2`` -> ``"1m15s"``: how long ago, for people."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _since(then: datetime | None, now: datetime) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def health(s: TaskSnapshot, now: datetime) -> str:
    """A task's supervision at ``now``: ``ok``, or its expired lease and heartbeat age
    (its node stopped renewing it: dead, frozen or cut off); ``-`` once finished."""
    if s.is_terminal:
        return "-"
    if not lease_expired(s, now):
        return "ok"
    expired = _since(s.lease_until, now)
    beat = _since(s.last_heartbeat_at, now)
    when = "no lease" if expired is None else f"LEASE EXPIRED {age(expired)} ago"
    return f"{when}, heartbeat {'never' if beat is None else age(beat) + ' ago'}"


def health_json(s: TaskSnapshot, now: datetime) -> dict[str, Any]:
    expired = lease_expired(s, now)
    return {
        "lease_expired": expired,
        "lease_expired_for": _since(s.lease_until, now) if expired else None,
        "heartbeat_age": _since(s.last_heartbeat_at, now),
    }


def dedupe(s: TaskSnapshot) -> str:
    """Its dedupe key, and how long a success keeps it."""
    kept = "" if s.dedupe_window is None else f" (kept {s.dedupe_window:g} s after a success)"
    return f"{s.dedupe_key!r}{kept}"


def clock(at: datetime) -> str:
    """``at`` on this machine's clock, to the second."""
    return at.astimezone().strftime("%H:%M:%S")


def status_text(s: TaskSnapshot, now: datetime, held: datetime | None = None) -> str:
    """Its status, and what a task that has not started waits for: a resume, since a
    pause holds it (``queued (held by a pause since 14:02:11)``), or its time
    (``queued (runs at 14:05:00, in 3m)``)."""
    if held is not None and s.status in WAITING:
        return f"{s.status.value} (held by a pause since {clock(held)})"
    if s.run_at is None or s.status not in WAITING or s.run_at <= now:
        return s.status.value
    left = age((s.run_at - now).total_seconds())
    return f"{s.status.value} (runs at {clock(s.run_at)}, in {left})"


def took(s: TaskSnapshot, now: datetime) -> str:
    """How long it ran: start to end once finished, start to now while running."""
    if s.started_at is None:
        return "-"
    end = s.ended_at if s.ended_at is not None else (None if s.is_terminal else now)
    return "-" if end is None else age(max(0.0, (end - s.started_at).total_seconds()))


SHORT_ID = 12
"""How much of an id a table shows; every command takes any unique prefix of 6+."""


def short_id(task_id: str) -> str:
    return task_id[:SHORT_ID]


def by_bucket(
    pairs: dict[tuple[int | None, TaskStatus], int],
) -> dict[int | None, dict[TaskStatus, int]]:
    """``count_tasks("bucket_status")`` as bucket -> status -> tasks."""
    per: dict[int | None, dict[TaskStatus, int]] = {}
    for (bucket, status), n in pairs.items():
        per.setdefault(bucket, {})[status] = n
    return per


_WILL_DO = {
    CommandAction.STOP: "will ask the task to stop at its next checkpoint",
    CommandAction.CANCEL: "will cancel it (a running task stops at its next checkpoint)",
    CommandAction.PAUSE: "will ask the task to pause at its next checkpoint",
    CommandAction.RESUME: "will resume it",
}
"""What the node holding a task does with an accepted command, once it has it."""


def control_outcome(receipt: ControlReceipt) -> str:
    """What a stop / pause / resume / cancel did, in words: exactly what happened."""
    o, status = ControlOutcome, receipt.status.value if receipt.status else "unknown"
    if receipt.accepted and receipt.behind is not None:
        return (
            f"request accepted (command {receipt.command_id}), after the pending "
            f"{receipt.behind.value}; the node holding the task acts on both in order"
        )
    if receipt.accepted:
        when = "is woken at once" if receipt.woken else "finds it at its next poll of the store"
        return (
            f"request accepted (command {receipt.command_id}); the node holding the task "
            f"{when} and {_WILL_DO[receipt.action]}"
        )
    if receipt.outcome is o.ALREADY_TERMINAL:
        return f"already {status}; nothing to do"
    if receipt.outcome is o.ALREADY_PAUSED:
        return f"already {status}"
    if receipt.outcome is o.NOT_PAUSED:
        return f"not paused (it is {status}); nothing to do"
    if receipt.outcome is o.PAUSE_PENDING:
        return (
            f"pause pending: {status}, not started yet; it pauses as soon as it starts, at "
            "its first checkpoint, and stays paused until resumed"
        )
    return str(receipt.outcome).replace("-", " ")


def ps_rows(
    snapshots: list[TaskSnapshot], now: datetime, holds: Mapping[str, datetime] | None = None
) -> tuple[list[str], list[list[str]]]:
    """A table of ``snapshots``; ``holds``: the tasks a pause holds before their start,
    and since when (``Capabilities.holds``)."""
    held = holds or {}
    headers = [
        "TASK ID",
        "NAME",
        "STATUS",
        "TRY",
        "BUCKET",
        "OWNER",
        "AGE",
        "TOOK",
        "PROGRESS",
        "HEALTH",
    ]
    rows = [
        [
            short_id(s.task_id),
            s.name,
            status_text(s, now, held.get(s.task_id)),
            str(s.attempt),
            "-" if s.bucket is None else str(s.bucket),
            s.owner or "-",
            age(max(0.0, (now - s.created_at).total_seconds())),
            took(s, now),
            f"{bar(s)} {s.progress.message or ''}".strip() if s.progress else "",
            health(s, now),
        ]
        for s in snapshots
    ]
    return headers, rows


def node_state(n: NodeStatus) -> str:
    """``stopped`` (a clean close), ``live`` or ``DEAD`` (silent past its TTL)."""
    if n.record.stopped_at is not None:
        return "stopped"
    return "live" if n.live else "DEAD"


def node_json(n: NodeStatus) -> dict[str, Any]:
    r = n.record
    return {
        "node": r.node,
        "state": node_state(n).lower(),
        "live": n.live,
        "buckets": None if r.buckets is None else format_buckets(r.buckets),
        "num_buckets": r.num_buckets,
        "seen_at": ts(r.seen_at),
        "seen_age": n.seen_age,
        "started_at": ts(r.started_at),
        "stopped_at": ts(r.stopped_at),
        "ttl_seconds": r.ttl_seconds,
        "host": r.host,
        "pid": r.pid,
        "active_tasks": n.active_tasks,
        "connections": None if r.health is None else r.health.connections,
        "health": None if r.health is None else r.health.as_dict(),
    }


def node_connections(n: NodeStatus) -> str:
    """The server connections a node last said it holds (``-``: none said, or no server)."""
    health = n.record.health
    return "-" if health is None or health.connections is None else str(health.connections)


def node_health(n: NodeStatus) -> str:
    """What a node says of its health, in a few words (``-``: it said nothing)."""
    health = n.record.health
    if health is None:
        return "-"
    words = []
    if health.store_failing_since is not None:
        words.append(f"store writes failing ({health.store_failures})")
    if health.unhealthy_services:
        words.append("died: " + ", ".join(health.unhealthy_services))
    if health.desynced:
        words.append(f"{health.desynced} desynced")
    return "; ".join(words) or "ok"


def nodes_rows(nodes: list[NodeStatus]) -> tuple[list[str], list[list[str]]]:
    headers = ["NODE", "STATE", "BUCKETS", "LAST SEEN", "ACTIVE", "CONNS", "HEALTH", "HOST", "PID"]
    rows = [
        [
            n.record.node,
            node_state(n),
            "all" if n.record.buckets is None else format_buckets(n.record.buckets) or "none",
            f"{age(n.seen_age)} ago",
            str(n.active_tasks),
            node_connections(n),
            node_health(n),
            n.record.host,
            str(n.record.pid),
        ]
        for n in nodes
    ]
    return headers, rows


@dataclass(frozen=True, slots=True)
class FleetSchedule:
    """One schedule as the fleet defines it: every node's record of it (each node that
    defines it records its own), read together. Its slots fire once fleet-wide, so its
    last firing is the latest any node made, and the node that made it ran it."""

    name: str
    records: tuple[ScheduleRecord, ...]
    """By node name."""

    @property
    def last(self) -> ScheduleRecord | None:
        """The record of the node that fired last, if any fired."""
        fired = [r for r in self.records if r.last_fired_at is not None]
        return max(fired, key=lambda r: r.last_fired_at or r.updated_at) if fired else None


def fleet_schedules(records: Iterable[ScheduleRecord]) -> list[FleetSchedule]:
    """The records read as one row a schedule, by name."""
    by_name: dict[str, list[ScheduleRecord]] = {}
    for r in records:
        by_name.setdefault(r.name, []).append(r)
    return [
        FleetSchedule(name, tuple(sorted(rs, key=lambda r: r.node)))
        for name, rs in sorted(by_name.items())
    ]


def _node_state(name: str, nodes: Mapping[str, NodeRecord], now: datetime) -> str:
    node = nodes.get(name)
    if node is None:
        return "unknown"
    if node.stopped_at is not None:
        return "stopped"
    return "live" if node.is_live(now) else "dead"


def schedule_state(s: FleetSchedule, nodes: Mapping[str, NodeRecord], now: datetime) -> str:
    """Whether a schedule can fire: while a node that defines it runs."""
    states = {_node_state(r.node, nodes, now) for r in s.records}
    if "live" in states:
        return "ok"
    if states == {"unknown"}:
        return "unknown node"
    if states <= {"stopped", "unknown"}:
        return "node stopped" if len(s.records) == 1 else "nodes stopped"
    return "node DEAD: will not fire" if len(s.records) == 1 else "no live node: will not fire"


def _next_slot(s: FleetSchedule, nodes: Mapping[str, NodeRecord], now: datetime) -> datetime | None:
    """The next slot as the live nodes see it (else as any recorded it)."""
    live = [r for r in s.records if _node_state(r.node, nodes, now) == "live"]
    due = [r.next_fire_at for r in live or s.records if r.next_fire_at is not None]
    return min(due) if due else None


def schedule_json(
    s: FleetSchedule,
    nodes: Mapping[str, NodeRecord],
    last: TaskSnapshot | None,
    now: datetime,
) -> dict[str, Any]:
    """``last``: the task of its last firing (``None``: none, or pruned)."""
    first, fired_last = s.records[0], s.last
    return {
        "name": s.name,
        "nodes": [r.node for r in s.records],
        "node_states": {r.node: _node_state(r.node, nodes, now) for r in s.records},
        "task": first.task,
        "trigger": first.trigger,
        "state": schedule_state(s, nodes, now),
        "next_fire_at": ts(_next_slot(s, nodes, now)),
        "last_fired_at": None if fired_last is None else ts(fired_last.last_fired_at),
        "last_task_id": None if fired_last is None else fired_last.last_task_id,
        "last_status": None if last is None else last.status.value,
        "last_fired_by": None if fired_last is None else fired_last.node,
        "fired": sum(r.fired for r in s.records),
        "skipped": sum(r.skipped for r in s.records),
        "updated_at": ts(max(r.updated_at for r in s.records)),
    }


def schedule_row(
    s: FleetSchedule, nodes: Mapping[str, NodeRecord], last: TaskSnapshot | None, now: datetime
) -> list[str]:
    state = schedule_state(s, nodes, now)
    upcoming_at = _next_slot(s, nodes, now)
    if upcoming_at is None:
        upcoming = "-"
    else:
        wait = (upcoming_at - now).total_seconds()
        upcoming = f"in {age(wait)}" if wait >= 0 else f"due {age(-wait)} ago"
    fired_last = s.last
    if fired_last is None or fired_last.last_fired_at is None:
        previous = "never"
    else:
        previous = f"{age(max(0.0, (now - fired_last.last_fired_at).total_seconds()))} ago"
        if fired_last.last_task_id is not None:
            status = "pruned" if last is None else last.status.value
            previous += f" {short_id(fired_last.last_task_id)} {status}"
        if len(s.records) > 1:
            previous += f" by {fired_last.node}"
    defined_by = []
    for r in s.records:
        node_state = _node_state(r.node, nodes, now)
        defined_by.append(r.node if node_state == "live" else f"{r.node} ({node_state})")
    return [
        s.name,
        ", ".join(defined_by),
        s.records[0].task,
        s.records[0].trigger,
        upcoming,
        previous,
        str(sum(r.fired for r in s.records)),
        str(sum(r.skipped for r in s.records)),
        state,
    ]


SCHEDULE_HEADERS = [
    "SCHEDULE",
    "NODES",
    "TASK",
    "TRIGGER",
    "NEXT",
    "LAST RUN",
    "FIRED",
    "SKIPPED",
    "STATE",
]


def alarm_json(a: Alarm) -> dict[str, Any]:
    return {
        "kind": a.kind.value,
        "message": a.message,
        "buckets": list(a.buckets),
        "nodes": list(a.nodes),
        "task_ids": list(a.task_ids),
        "count": a.count,
    }


def doctor_text(report: FleetReport) -> str:
    live = sum(1 for n in report.nodes if n.live)
    lines = [
        f"checked at {ts(report.checked_at)}: {len(report.nodes)} node(s) declared, {live} "
        f"live; {report.num_buckets} buckets"
        + (" (as the nodes declared)" if report.num_buckets_declared else "")
    ]
    if not report.registry:
        lines.append("note: this store keeps no node declarations; bucket checks skipped")
    if report.healthy:
        lines.append("healthy: no alarm")
        return "\n".join(lines)
    for alarm in report.alarms:
        lines.append(f"ALARM {alarm.kind.value}: {alarm.message}")
        lines += [f"  {task_id}" for task_id in alarm.task_ids]
        if alarm.count > len(alarm.task_ids):
            lines.append(f"  ... and {alarm.count - len(alarm.task_ids)} more")
    return "\n".join(lines)


def late_report_json(r: LateReport) -> dict[str, Any]:
    return {
        "reported_by": r.reported_by,
        "reported_at": ts(r.reported_at),
        "status": r.status.value,
        "stored_status": r.stored_status.value,
        "ended_at": ts(r.ended_at),
        "outcome": r.outcome,
        "failure": None if r.failure is None else r.failure.message,
    }


def lease_text(s: TaskSnapshot) -> str:
    """Who supervises ``s`` and until when; a finished task has no supervisor to judge."""
    if s.is_terminal:
        return "none (finished)"
    return f"{s.lease_owner or '-'} until {ts(s.lease_until) or '-'}"


def trace_id(context: str) -> str:
    """The trace id of a stored W3C trace context (what a tracing UI searches by), or
    the text as stored if it is not one."""
    parts = context.split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else context


def carrier(s: TaskSnapshot) -> str:
    """What runs its function, as its definition's tag says: ``process``, ``async`` or
    ``thread``."""
    return "process" if "process" in s.tags else "async" if "async" in s.tags else "thread"


def suspended(s: TaskSnapshot, trail: Iterable[Transition]) -> str | None:
    """The trail's word on a paused process task whose worker process a pause stopped
    (which process, since when), from ``trail`` (its latest transitions will do);
    ``None`` for any other task."""
    if s.status is not TaskStatus.PAUSED or carrier(s) != "process":
        return None
    for t in trail:
        if t.version == s.status_version and (t.reason or "").startswith("suspended"):
            return f"{t.reason} at {ts(t.at)}"
    return None


CARRIERS = {
    "process": "process (a worker process of its node)",
    "async": "async (its node's event loop)",
    "thread": "thread (a worker thread of its node)",
}


def show_text(
    s: TaskSnapshot,
    now: datetime,
    late: LateReport | None = None,
    held: datetime | None = None,
    suspended: str | None = None,
) -> str:
    """``suspended``: the trail's word on a paused process task whose worker process a
    pause stopped (which process, since when)."""
    fields: list[tuple[str, str]] = [
        ("task", s.task_id),
        ("name", s.name),
        ("status", f"{s.status.value} (version {s.status_version}, attempt {s.attempt})"),
        *([("suspended", suspended)] if suspended else []),
        ("carrier", CARRIERS[carrier(s)]),
        *([("held", f"by a pause since {ts(held)}: it waits for a resume")] if held else []),
        *([("runs at", f"{ts(s.run_at)} ({status_text(s, now)})")] if s.run_at else []),
        *([("priority", str(s.priority))] if s.priority else []),
        *([("dedupe key", dedupe(s))] if s.dedupe_key is not None else []),
        *([("concurrency key", repr(s.concurrency_key))] if s.concurrency_key else []),
        ("tags", ", ".join(sorted(s.tags)) or "-"),
        ("bucket", "-" if s.bucket is None else f"{s.bucket} (key {s.bucket_key!r})"),
        ("pipeline", s.pipeline_run_id or "-"),
        *([("trace", trace_id(s.trace_context))] if s.trace_context else []),
        ("owner", s.owner or "-"),
        ("created", ts(s.created_at) or "-"),
        ("started", ts(s.started_at) or "-"),
        ("ended", ts(s.ended_at) or "-"),
        ("heartbeat", ts(s.last_heartbeat_at) or "-"),
        ("lease", lease_text(s)),
        ("health", health(s, now)),
    ]
    if s.progress is not None:
        p = s.progress
        total = "?" if p.total is None else f"{p.total:g}"
        fields.append(("progress", f"{p.current:g}/{total} {bar(s)} {p.message or ''}".rstrip()))
    if s.failure is not None:
        # Each failure's message says what may still run (``carrier_may_run``) itself.
        fields.append(("failure", f"{s.failure.kind.value}: {s.failure.message}"))
    if s.status is TaskStatus.SUCCEEDED:
        fields.append(("outcome", repr(s.outcome)))
    if late is not None:
        fields.append(("late report", late.summary()))
    width = max(len(k) for k, _ in fields)
    text = "\n".join(f"{k.ljust(width)}  {printable(v)}" for k, v in fields)
    if s.failure is not None and s.failure.traceback:
        text += "\n\n" + printable(s.failure.traceback.rstrip("\n"), lines=True)
    return text


def history_rows(transitions: list[Transition]) -> tuple[list[str], list[list[str]]]:
    headers = ["VERSION", "AT", "FROM", "TO", "ACTOR", "REASON"]
    rows = [
        [
            str(t.version),
            ts(t.at) or "",
            t.from_status.value if t.from_status else "-",
            t.to_status.value,
            t.actor or "-",
            t.reason or "",
        ]
        for t in transitions
    ]
    return headers, rows
