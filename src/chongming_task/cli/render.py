"""Turning records into table rows and JSON; nothing here touches a store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..model import TaskSnapshot, TaskStatus, Transition

__all__ = [
    "bar",
    "history_rows",
    "ps_rows",
    "show_text",
    "snapshot_json",
    "table",
    "transition_json",
    "ts",
]


def ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="milliseconds")


def snapshot_json(s: TaskSnapshot) -> dict[str, Any]:
    return {
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
        },
        "outcome": s.outcome,
        "lease_owner": s.lease_owner,
        "lease_until": ts(s.lease_until),
    }


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
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def ps_rows(snapshots: list[TaskSnapshot]) -> tuple[list[str], list[list[str]]]:
    headers = ["TASK ID", "NAME", "STATUS", "TRY", "BUCKET", "OWNER", "PROGRESS"]
    rows = [
        [
            s.task_id,
            s.name,
            s.status.value,
            str(s.attempt),
            "-" if s.bucket is None else str(s.bucket),
            s.owner or "-",
            bar(s),
        ]
        for s in snapshots
    ]
    return headers, rows


def show_text(s: TaskSnapshot) -> str:
    fields: list[tuple[str, str]] = [
        ("task", s.task_id),
        ("name", s.name),
        ("status", f"{s.status.value} (version {s.status_version}, attempt {s.attempt})"),
        ("tags", ", ".join(sorted(s.tags)) or "-"),
        ("bucket", "-" if s.bucket is None else f"{s.bucket} (key {s.bucket_key!r})"),
        ("pipeline", s.pipeline_run_id or "-"),
        ("owner", s.owner or "-"),
        ("created", ts(s.created_at) or "-"),
        ("started", ts(s.started_at) or "-"),
        ("ended", ts(s.ended_at) or "-"),
        ("heartbeat", ts(s.last_heartbeat_at) or "-"),
        ("lease", f"{s.lease_owner or '-'} until {ts(s.lease_until) or '-'}"),
    ]
    if s.progress is not None:
        p = s.progress
        total = "?" if p.total is None else f"{p.total:g}"
        fields.append(("progress", f"{p.current:g}/{total} {bar(s)} {p.message or ''}".rstrip()))
    if s.failure is not None:
        f = s.failure
        note = " (its carrier may still be running)" if f.carrier_may_run else ""
        fields.append(("failure", f"{f.kind.value}: {f.message}{note}"))
    if s.status is TaskStatus.SUCCEEDED:
        fields.append(("outcome", repr(s.outcome)))
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)


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
