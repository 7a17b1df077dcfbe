"""What each page shows, as plain data for the templates: read from the store in as few
questions as the CLI asks (``GROUP BY``s the indexes answer), never a whole table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import fleet, present
from ..lookup import find_pipeline_run, holds_of
from ..model import TaskQuery, TaskSnapshot, TaskStatus
from ..stores.roles import PREVIEW, Previewed
from .follow import SLOT, SLOTS, Finished

if TYPE_CHECKING:
    from .dashboard import Dashboard

__all__ = [
    "age",
    "clock",
    "control_outcome",
    "health",
    "nodes",
    "overview",
    "pipeline",
    "pipelines",
    "schedules",
    "short",
    "status_style",
    "task",
]

age = present.age
short = present.short_id
health = present.health
control_outcome = present.control_outcome

CHART_LEFT, CHART_TOP, CHART_HEIGHT = 44, 8, 60
"""Where the finished tasks' bars stand in the chart's SVG: room on the left for the
count axis, above for the tallest bar's label."""

_STYLE = {
    "succeeded": "ok",
    "failed": "bad",
    "lost": "bad",
    "stopped": "warn",
    "cancelled": "warn",
    "paused": "info",
    "pausing": "info",
    "running": "run",
    "stopping": "warn",
}


def status_style(status: TaskStatus | str) -> str:
    return _STYLE.get(str(status), "")


def status_text(t: TaskSnapshot, held: datetime | None = None) -> str:
    """Its status, and what a task that has not started waits for: a resume (``held``:
    since when a pause holds it) or its time."""
    return present.status_text(t, datetime.now(UTC), held)


def clock(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def overview(d: Dashboard) -> dict[str, Any]:
    """The overview from the follower's latest aggregates (never a whole-store query in
    the request: those run in the follower's thread)."""
    latest = d.follower.latest()
    counts, report = latest.counts, latest.report
    totals, unfinished = latest.bucket_totals, latest.unfinished
    live = [n.record for n in report.nodes if n.live]
    owners = fleet.declared_buckets(live)
    everywhere = [r.node for r in live if r.buckets is None]
    alarmed = {b for a in report.alarms for b in a.buckets}
    per = present.by_bucket(unfinished)
    busiest = max((sum(c.values()) for c in per.values()), default=0)
    cells = []
    for b in range(report.num_buckets):  # the count judged by: given, or declared
        active = sum(per.get(b, {}).values())
        cells.append(
            {
                "bucket": b,
                "tasks": totals.get(b, 0),
                "active": active,
                "heat": 0 if not busiest else round(4 * active / busiest),
                "owners": owners.get(b, []) or everywhere,
                "alarm": b in alarmed,
            }
        )
    return {
        "as_of": latest.at,
        "chart": _chart(latest.finished),
        "counts": [(s.value, counts.get(s, 0)) for s in TaskStatus],
        "total": sum(counts.values()),
        "report": report,
        "cells": cells,
        "unbucketed": totals.get(None, 0),
    }


def _chart(finished: Finished) -> dict[str, Any]:
    """The tasks that finished in the last ten minutes, per 10 s (the store's count), as
    SVG bars with their axes: succeeded below, every other
    ending stacked above it. A task that ended after the newest slot began by a clock
    ahead of the store's joins the newest bar."""
    slots: list[dict[str, int]] = [{} for _ in range(SLOTS)]
    for (k, status), n in sorted(finished.counts.items(), key=lambda kv: kv[0][1].value):
        if k >= 0:
            counts = slots[min(k, SLOTS - 1)]
            counts[status.value] = counts.get(status.value, 0) + n
    tallest = max((sum(c.values()) for c in slots), default=0)
    scale = CHART_HEIGHT / (tallest or 1)
    bars = []
    for i, counts in enumerate(slots):
        good = counts.get("succeeded", 0)
        start = finished.since + SLOT * i
        said = ", ".join(f"{n} {status}" for status, n in counts.items()) or "none"
        bars.append(
            {
                "x": CHART_LEFT + i * 8,
                "good": good * scale,
                "bad": (sum(counts.values()) - good) * scale,
                "title": f"{start:%H:%M:%S}-{start + SLOT:%H:%M:%S} UTC: {said}",
            }
        )
    total = sum(sum(c.values()) for c in slots)
    span = (finished.at - finished.since).total_seconds()
    return {
        "bars": bars,
        "tallest": tallest,
        "total": total,
        "per_second": total / span if span > 0 else 0.0,
        "left": CHART_LEFT,
        "right": CHART_LEFT + SLOTS * 8,
        "bottom": CHART_TOP + CHART_HEIGHT,
        "top": CHART_TOP,
    }


def task(d: Dashboard, found: Previewed) -> dict[str, Any]:
    """A task's page; ``found``: the task with a large result cut to its preview."""
    s = found.snapshot
    now = d.now()
    late = next(iter(d.caps.late_reports(task_ids=[s.task_id])), None)
    held = holds_of(d.caps, [s]).get(s.task_id)
    trail = d.store.history(s.task_id)
    return {
        "now": now,
        "t": s,
        "held": held,
        "late": None if late is None else late.summary(),
        "trail": trail,
        "carrier": present.CARRIERS[present.carrier(s)],
        "suspended": present.suspended(s, trail),
        "health": present.health(s, now),
        "took": present.took(s, now),
        "fraction": s.progress.fraction if s.progress else None,
        "heartbeat_age": None
        if s.last_heartbeat_at is None
        else present.age(max(0.0, (now - s.last_heartbeat_at).total_seconds())),
        "lease_left": None if s.lease_until is None else (s.lease_until - now).total_seconds(),
        **_preview(found),
        "controls": _controls(s, held is not None),
        # A finished task changes no more (a lost one may still get a late report): its
        # page stops fetching itself again.
        "follow": not s.is_terminal or s.status is TaskStatus.LOST,
    }


RESULT_PREVIEW = PREVIEW
"""Characters of a result the task page shows; the whole value is a link away."""


def _preview(found: Previewed) -> dict[str, Any]:
    """The start of a succeeded task's result as JSON, and whether there is more: a large
    result's preview as the store wrote it, else the result encoded only as far as
    shown."""
    s = found.snapshot
    if s.status is not TaskStatus.SUCCEEDED:
        return {"result_preview": None, "result_cut": False}
    if found.preview is not None:
        return {"result_preview": found.preview, "result_cut": True}
    shown: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(s.outcome):
        shown.append(chunk)
        size += len(chunk)
        if size > RESULT_PREVIEW:
            return {"result_preview": "".join(shown)[:RESULT_PREVIEW], "result_cut": True}
    return {"result_preview": "".join(shown), "result_cut": False}


def _controls(s: TaskSnapshot, held: bool = False) -> list[str]:
    if s.is_terminal:
        return []
    if held or s.status in (TaskStatus.PAUSED, TaskStatus.PAUSING):
        return ["resume", "stop", "cancel"]
    return ["pause", "stop", "cancel"]


def schedules(d: Dashboard) -> dict[str, Any]:
    now = d.now()
    nodes = {n.node: n for n in d.caps.nodes()}
    rows = []
    for s in present.fleet_schedules(d.caps.schedules()):
        fired = s.last
        last_id = None if fired is None else fired.last_task_id
        last = None if last_id is None else d.store.get(last_id)
        rows.append(
            {
                "row": present.schedule_row(s, nodes, last, now),
                "state": present.schedule_state(s, nodes, now),
                "last": last,
            }
        )
    return {"now": now, "rows": rows, "has_registry": d.caps.has_fleet_registry}


def nodes(d: Dashboard) -> dict[str, Any]:
    now = d.now()
    statuses = fleet.node_statuses(d.caps, now)
    return {
        "now": now,
        "nodes": [{**present.node_json(n), "said": present.node_health(n)} for n in statuses],
        "has_registry": d.caps.has_fleet_registry,
    }


BOX_W, BOX_H, GAP_X, GAP_Y = 170, 48, 60, 18


def pipelines(d: Dashboard) -> dict[str, Any]:
    """The newest recorded pipeline runs, each with its tasks counted by status."""
    rows = []
    for record in d.caps.pipeline_records(limit=30):
        tasks = d.store.query(TaskQuery(pipeline_run_id=record.pipeline_run_id, brief=True))
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.status.value] = counts.get(t.status.value, 0) + 1
        rows.append({"record": record, "counts": sorted(counts.items()), "size": len(tasks)})
    return {"rows": rows, "has_registry": d.caps.has_fleet_registry}


def pipeline(d: Dashboard, given: str) -> dict[str, Any]:
    """One run as a graph: node keys in columns by depth, an arrow from each dependency."""
    # A full id names its record even after the run's tasks were pruned.
    record = d.caps.pipeline_record(given) or d.caps.pipeline_record(
        find_pipeline_run(d.store, given) or given
    )
    if record is None:
        raise LookupError(f"no recorded pipeline run {given} in {d.where}")
    depth: dict[str, int] = {}

    def level(key: str) -> int:
        if key not in depth:
            deps = record.depends_on.get(key, ())
            depth[key] = 0 if not deps else 1 + max(level(k) for k in deps)
        return depth[key]

    columns: dict[int, list[str]] = {}
    for key in record.tasks:
        columns.setdefault(level(key), []).append(key)
    # One brief read of the run's tasks: a box shows no result.
    read = TaskQuery(pipeline_run_id=record.pipeline_run_id, brief=True)
    found = {s.task_id: s for s in d.store.query(read)}
    boxes: dict[str, dict[str, Any]] = {}
    for col, keys in columns.items():
        for row, key in enumerate(keys):
            snapshot = found.get(record.tasks[key])
            boxes[key] = {
                "key": key,
                "x": 10 + col * (BOX_W + GAP_X),
                "y": 10 + row * (BOX_H + GAP_Y),
                "task": snapshot,
                "task_id": record.tasks[key],
                "status": snapshot.status.value if snapshot else "pruned",
            }
    edges = [
        {
            "x1": boxes[dep]["x"] + BOX_W,
            "y1": boxes[dep]["y"] + BOX_H / 2,
            "x2": boxes[key]["x"],
            "y2": boxes[key]["y"] + BOX_H / 2,
        }
        for key, deps in record.depends_on.items()
        for dep in deps
        if dep in boxes and key in boxes
    ]
    width = 20 + len(columns) * (BOX_W + GAP_X) - GAP_X
    height = 20 + max(len(keys) for keys in columns.values()) * (BOX_H + GAP_Y) - GAP_Y
    return {
        "record": record,
        "boxes": list(boxes.values()),
        "edges": edges,
        "width": width,
        "height": height,
        "box_w": BOX_W,
        "box_h": BOX_H,
    }
