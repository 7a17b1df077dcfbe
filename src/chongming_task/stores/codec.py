"""Serialization between records and flat rows (column name -> primitive).

Reuse these instead of writing your own: they carry the three hard rules of the store
guide. Times are converted to UTC before they are stored (fixed-width ISO 8601, so text
order is time order); the round trip is exact (``row_to_snapshot(snapshot_to_row(s)) ==
s``); enums are written by ``.value``. Nested values (progress, failure, outcome) are JSON
text; a relational store keeps each row as is, a document store as a sub-object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from ..errors import UnreadableRow
from ..late import LateReport
from ..model import (
    Command,
    CommandAction,
    Failure,
    FailureKind,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
    trusted_snapshot,
    utc,
)
from ..trail import STATUS_TEXT

__all__ = [
    "COMMAND_COLUMNS",
    "LEASE_COLUMNS",
    "LIFE_COLUMNS",
    "OPTION_COLUMNS",
    "SAVE_COLUMNS",
    "STATUS_TEXT",
    "TASK_COLUMNS",
    "TRANSITION_COLUMNS",
    "Primitive",
    "Row",
    "command_to_row",
    "command_to_values",
    "decode_dt",
    "decode_failure",
    "decode_json",
    "decode_progress",
    "decode_tags",
    "encode_dt",
    "encode_failure",
    "encode_json",
    "encode_progress",
    "encode_tags",
    "encoded_once",
    "life_values",
    "row_to_command",
    "row_to_snapshot",
    "row_to_transition",
    "snapshot_to_row",
    "snapshot_to_values",
    "touch_values",
    "transition_to_row",
    "transition_to_values",
    "values_to_command",
    "values_to_snapshot",
    "values_to_transition",
]

Primitive = str | int | float | bool | None
Row = dict[str, Primitive]

TASK_COLUMNS: tuple[str, ...] = (
    "task_id",
    "name",
    "status",
    "status_version",
    "attempt",
    "tags",
    "bucket",
    "bucket_key",
    "pipeline_run_id",
    "owner",
    "created_at",
    "started_at",
    "ended_at",
    "last_heartbeat_at",
    "progress",
    "failure",
    "outcome",
    "lease_owner",
    "lease_until",
    "run_at",
    "priority",
    "dedupe_key",
    "dedupe_window",
    "concurrency_key",
    "trace_context",
)
OPTION_COLUMNS: tuple[str, ...] = TASK_COLUMNS[-6:-1]
"""How a task was submitted (``node.options``): fixed at create, like its identity."""
_LATER = frozenset((*OPTION_COLUMNS, "trace_context"))
"""Columns added after the first schema: a row made before them may lack them."""
LEASE_COLUMNS: tuple[str, ...] = ("lease_owner", "lease_until")
_FIXED_AT_CREATE = frozenset(
    ("task_id", "name", "tags", "bucket", "bucket_key", "pipeline_run_id", "owner", "created_at")
).union(_LATER)
LIFE_COLUMNS: tuple[str, ...] = tuple(
    c for c in TASK_COLUMNS if c not in _FIXED_AT_CREATE and c not in LEASE_COLUMNS
)
"""The columns a task's life changes (the identity columns are fixed at create, the lease
is ``touch``'s): what the SQL stores' compare-and-set writes."""
SAVE_COLUMNS: tuple[str, ...] = tuple(c for c in TASK_COLUMNS if c not in LEASE_COLUMNS)
"""What ``save`` writes: everything but the lease, which only ``touch`` writes."""

TRANSITION_COLUMNS: tuple[str, ...] = (
    "task_id",
    "version",
    "from_status",
    "to_status",
    "at",
    "reason",
    "actor",
)
COMMAND_COLUMNS: tuple[str, ...] = (
    "command_id",
    "task_id",
    "action",
    "issued_by",
    "created_at",
    "reason",
    "lease_until",
    "finished_at",
    "outcome",
)


_ZERO = timedelta(0)


@overload
def encode_dt(value: datetime) -> str: ...
@overload
def encode_dt(value: None) -> None: ...
@overload
def encode_dt(value: datetime | None) -> str | None: ...
def encode_dt(value: datetime | None) -> str | None:
    """UTC, fixed-width ISO 8601 text; ``None`` stays ``None``. Naive input is rejected."""
    if value is None:
        return None
    # Fixed width ("...T12:00:00.000000+00:00"), so text order is time order. The same
    # text as isoformat(timespec="microseconds"), built from the fields: a third of the
    # cost of isoformat or of a %-format of seven numbers (every write makes several).
    if value.tzinfo is not UTC:
        value = utc(value)
    year = value.year
    if year < 1000:  # a four-digit year needs its zeros
        return _ISO % (
            year,
            value.month,
            value.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
        )
    two = _TWO_DIGITS
    return (
        f"{year}-{two[value.month]}-{two[value.day]}T{two[value.hour]}:"
        f"{two[value.minute]}:{two[value.second]}.{str(1_000_000 + value.microsecond)[1:]}+00:00"
    )


_TWO_DIGITS = tuple(f"{n:02d}" for n in range(60))
_ISO = "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00"


def decode_dt(value: str | datetime | None) -> datetime | None:
    """Inverse of ``encode_dt``; also accepts an aware ``datetime`` (native driver types)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is UTC:
            return value
        if value.utcoffset() == _ZERO:  # a driver's own UTC zone (psycopg: Etc/UTC)
            return value.replace(tzinfo=UTC)
        return utc(value)
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"stored time {value!r} has no zone; stores keep UTC")
    return utc(parsed)


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_STRICT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
"""One encoder each, made once: ``json.dumps`` with any option makes an encoder a call."""


def encode_tags(tags: Iterable[str]) -> str:
    """Tags as a sorted JSON array (exact matching can then test array membership).

    A task's tags (a frozenset) are encoded once a set: every ``async`` or ``process``
    task carries one, and each submit encoded it anew (8 % of an ``async def`` task's
    submit on SQLite, bench/async_tasks.py)."""
    if not tags:
        return "[]"
    if type(tags) is not frozenset:
        return _COMPACT(sorted(tags))
    text = _TAG_TEXTS.get(tags)
    if text is None:
        text = _COMPACT(sorted(tags))
        if len(_TAG_TEXTS) < _MAX_TAG_SETS:
            _TAG_TEXTS[tags] = text
    return text


_NO_TAGS: frozenset[str] = frozenset()
_MAX_TAG_SETS = 4096
_TAG_SETS: dict[str, frozenset[str]] = {}
"""Decoded tag arrays by their text: a store holds few distinct ones (bounded)."""
_TAG_TEXTS: dict[frozenset[str], str] = {}
"""Encoded tag sets, the other way round (bounded as well)."""


def decode_tags(value: str | list[str] | None) -> frozenset[str]:
    if value is None or value == "[]":
        return _NO_TAGS
    if isinstance(value, list):
        return frozenset(value)
    found = _TAG_SETS.get(value)
    if found is None:
        found = frozenset(json.loads(value))
        if len(_TAG_SETS) < _MAX_TAG_SETS:
            _TAG_SETS[value] = found
    return found


def encode_json(value: Any) -> str | None:
    """Strict JSON text (no NaN/Infinity); ``None`` stays ``None`` (SQL NULL)."""
    if value is None:
        return None
    return _STRICT(value)


def decode_json(value: Any) -> Any:
    if value is None or not isinstance(value, str | bytes):
        return value  # already decoded by the driver (e.g. JSONB)
    return json.loads(value)


def encode_progress(progress: Progress | None) -> str | None:
    if progress is None:
        return None
    return encode_json(
        {"current": progress.current, "total": progress.total, "message": progress.message}
    )


def decode_progress(value: Any) -> Progress | None:
    data = decode_json(value)
    if data is None:
        return None
    return Progress(current=data["current"], total=data.get("total"), message=data.get("message"))


def encoded_once() -> Callable[[Any, Callable[[Any], Any]], Any]:
    """``once(value, encode)``: ``encode(value)``, computed once for each object and
    encoder (``reconcile()`` marks many tasks with one time and one failure object).
    Keyed by identity: the values must stay alive while ``once`` is used."""
    seen: dict[tuple[int, Callable[[Any], Any]], Any] = {}

    def once(value: Any, encode: Callable[[Any], Any]) -> Any:
        key = (id(value), encode)
        if key not in seen:
            seen[key] = encode(value)
        return seen[key]

    return once


def encode_failure(failure: Failure | None) -> str | None:
    if failure is None:
        return None
    data: dict[str, Any] = {
        "kind": failure.kind.value,
        "message": failure.message,
        "exception_type": failure.exception_type,
        "carrier_may_run": failure.carrier_may_run,
    }
    if failure.traceback is not None:  # absent, not null: older rows read the same
        data["traceback"] = failure.traceback
    return encode_json(data)


def decode_failure(value: Any) -> Failure | None:
    data = decode_json(value)
    if data is None:
        return None
    return Failure(
        kind=FailureKind(data["kind"]),
        message=data["message"],
        exception_type=data.get("exception_type"),
        carrier_may_run=bool(data.get("carrier_may_run", False)),
        traceback=data.get("traceback"),
    )


def snapshot_to_row(snapshot: TaskSnapshot) -> Row:
    return dict(zip(TASK_COLUMNS, snapshot_to_values(snapshot), strict=True))


def row_to_snapshot(row: Mapping[str, Any]) -> TaskSnapshot:
    """A row as ``snapshot_to_row`` made it; a row written before the option columns
    (or the trace context) existed reads as submitted without them."""
    return values_to_snapshot([row[c] if c not in _LATER else row.get(c) for c in TASK_COLUMNS])


def transition_to_row(transition: Transition) -> Row:
    return dict(zip(TRANSITION_COLUMNS, transition_to_values(transition), strict=True))


def row_to_transition(row: Mapping[str, Any]) -> Transition:
    at = decode_dt(row["at"])
    assert at is not None
    return Transition(
        task_id=row["task_id"],
        version=int(row["version"]),
        from_status=TaskStatus(row["from_status"]) if row["from_status"] else None,
        to_status=TaskStatus(row["to_status"]),
        at=at,
        reason=row["reason"],
        actor=row["actor"],
    )


def command_to_row(command: Command) -> Row:
    return {
        "command_id": command.command_id,
        "task_id": command.task_id,
        "action": command.action.value,
        "issued_by": command.issued_by,
        "created_at": encode_dt(command.created_at),
        "reason": command.reason,
        "lease_until": encode_dt(command.lease_until),
        "finished_at": encode_dt(command.finished_at),
        "outcome": command.outcome,
    }


def row_to_command(row: Mapping[str, Any]) -> Command:
    created_at = decode_dt(row["created_at"])
    assert created_at is not None
    return Command(
        command_id=row["command_id"],
        task_id=row["task_id"],
        action=CommandAction(row["action"]),
        issued_by=row["issued_by"],
        created_at=created_at,
        reason=row["reason"],
        lease_until=decode_dt(row["lease_until"]),
        finished_at=decode_dt(row["finished_at"]),
        outcome=row["outcome"],
    )


# Positional rows (a SQL cursor's tuples, columns in the order of the *_COLUMNS above).


def snapshot_to_values(snapshot: TaskSnapshot) -> list[Any]:
    """A snapshot's columns in ``TASK_COLUMNS`` order (every create makes one: built
    directly, no row dict in between; ``snapshot_to_row`` is these, keyed). The columns a
    life changes are ``life_values``'s, so each is encoded in one place."""
    status, version, attempt, *lived = life_values(snapshot)
    return [
        snapshot.task_id,
        snapshot.name,
        status,
        version,
        attempt,
        encode_tags(snapshot.tags),
        snapshot.bucket,
        snapshot.bucket_key,
        snapshot.pipeline_run_id,
        snapshot.owner,
        encode_dt(snapshot.created_at),
        *lived,
        snapshot.lease_owner,
        encode_dt(snapshot.lease_until),
        None if snapshot.run_at is None else encode_dt(snapshot.run_at),
        snapshot.priority,
        snapshot.dedupe_key,
        snapshot.dedupe_window,
        snapshot.concurrency_key,
        snapshot.trace_context,
    ]


def life_values(snapshot: TaskSnapshot) -> list[Any]:
    """``snapshot``'s ``LIFE_COLUMNS``, in that order. Most of them are ``None`` most of
    the time (a new task's six, a success's three): tested here, not by a call apiece."""
    started, ended, heartbeat = snapshot.started_at, snapshot.ended_at, snapshot.last_heartbeat_at
    progress, failure, outcome = snapshot.progress, snapshot.failure, snapshot.outcome
    return [
        STATUS_TEXT[snapshot.status],
        snapshot.status_version,
        snapshot.attempt,
        None if started is None else encode_dt(started),
        None if ended is None else encode_dt(ended),
        None if heartbeat is None else encode_dt(heartbeat),
        None if progress is None else encode_progress(progress),
        None if failure is None else encode_failure(failure),
        None if outcome is None else encode_json(outcome),
    ]


def transition_to_values(transition: Transition, *, at: str | None = None) -> list[Any]:
    """A transition's columns in ``TRANSITION_COLUMNS`` order (every write appends some:
    built directly, no row dict in between). ``at``: ``transition.at`` already encoded,
    where the caller has it."""
    from_status = transition.from_status
    return [
        transition.task_id,
        transition.version,
        None if from_status is None else STATUS_TEXT[from_status],
        STATUS_TEXT[transition.to_status],
        encode_dt(transition.at) if at is None else at,
        transition.reason,
        transition.actor,
    ]


def command_to_values(command: Command) -> list[Any]:
    row = command_to_row(command)
    return [row[c] for c in COMMAND_COLUMNS]


def touch_values(
    task_id: str,
    progress: Progress | None,
    heartbeat_at: datetime | None,
    lease_owner: str | None,
    lease_until: datetime | None,
) -> list[Any] | None:
    """``touch``'s parameters for a SQL ``UPDATE ... SET col = COALESCE(?, col)`` (progress,
    heartbeat, lease owner, lease until, then the id); ``None`` when there is nothing to
    write."""
    if progress is None and heartbeat_at is None and lease_owner is None and lease_until is None:
        return None
    return [
        encode_progress(progress),
        encode_dt(heartbeat_at),
        lease_owner,
        encode_dt(lease_until),
        task_id,
    ]


def values_to_snapshot(values: Sequence[Any]) -> TaskSnapshot:
    """A row in ``TASK_COLUMNS`` order as a snapshot (every query decodes its rows here;
    ``row_to_snapshot`` is this for a mapping). Every value is normalised here (UTC
    times, frozenset tags): the trusted builder skips re-validation. ``UnreadableRow``,
    naming the task and the field, for a value no writer of a store writes."""
    try:
        return _values_to_snapshot(values)
    except Exception as exc:  # ValueError, TypeError, RecursionError (JSON too deep), ...
        raise unreadable(values, TASK_COLUMNS, exc) from None


def unreadable(values: Sequence[Any], columns: Sequence[str], exc: Exception) -> UnreadableRow:
    """The error for a row that did not decode: the first of its fields that does not
    on its own (the cause's text where none does)."""
    task_id = str(values[0]) if values else "?"
    for column, value in zip(columns, values, strict=False):
        decode = _DECODERS.get(column)
        if decode is None or value is None:
            continue
        try:
            decode(value)
        except Exception as cause:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            why = "nested too deep" if isinstance(cause, RecursionError) else str(cause)
            return UnreadableRow(
                f"task {task_id}: its {column} {shown} cannot be read ({why})",
                task_id=task_id,
                field=column,
            )
    said = f"task {task_id}: its row cannot be read ({exc!r})"
    return UnreadableRow(said, task_id=task_id, field="")


_left_out: ContextVar[list[UnreadableRow] | None] = ContextVar("left_out", default=None)


@contextmanager
def left_out() -> Iterator[list[UnreadableRow]]:
    """Within: the rows a list read leaves out (``leave_out``) are gathered here, not
    said (a lookup raises the one it wanted instead of saying there is none)."""
    gathered: list[UnreadableRow] = []
    mark = _left_out.set(gathered)
    try:
        yield gathered
    finally:
        _left_out.reset(mark)


def leave_out(exc: UnreadableRow, log: logging.Logger) -> None:
    """A list read left a row out: gathered where ``left_out`` is open, else said in
    one line (the rest of the list is read)."""
    gathered = _left_out.get()
    if gathered is not None:
        gathered.append(exc)
    else:
        say_once(log, f"{exc}: left out of the list")


def say_once(log: logging.Logger, message: str) -> None:
    """Warn ``message`` once a process (a dashboard reads its lists every second)."""
    if message in _said:
        return
    if len(_said) < _SAY_AT_MOST:
        _said.add(message)
    log.warning("%s", message)


_said: set[str] = set()
_SAY_AT_MOST = 1000
"""Messages said once each, up to this many (past it, each time)."""


def _values_to_snapshot(values: Sequence[Any]) -> TaskSnapshot:
    (
        task_id,
        name,
        status,
        status_version,
        attempt,
        tags,
        bucket,
        bucket_key,
        pipeline_run_id,
        owner,
        created_at,
        started_at,
        ended_at,
        last_heartbeat_at,
        progress,
        failure,
        outcome,
        lease_owner,
        lease_until,
        run_at,
        priority,
        dedupe_key,
        dedupe_window,
        concurrency_key,
        trace_context,
    ) = values
    created = decode_dt(created_at)
    assert created is not None, "created_at is NOT NULL in every store"
    snapshot: TaskSnapshot = trusted_snapshot(
        task_id=task_id,
        name=name,
        status=TaskStatus(status),
        status_version=int(status_version),
        attempt=int(attempt),
        tags=decode_tags(tags),
        bucket=bucket,
        bucket_key=bucket_key,
        pipeline_run_id=pipeline_run_id,
        owner=owner,
        created_at=created,
        started_at=None if started_at is None else decode_dt(started_at),
        ended_at=None if ended_at is None else decode_dt(ended_at),
        last_heartbeat_at=None if last_heartbeat_at is None else decode_dt(last_heartbeat_at),
        progress=None if progress is None else decode_progress(progress),
        failure=None if failure is None else decode_failure(failure),
        outcome=None if outcome is None else decode_json(outcome),
        lease_owner=lease_owner,
        lease_until=None if lease_until is None else decode_dt(lease_until),
        run_at=None if run_at is None else decode_dt(run_at),
        priority=int(priority or 0),
        dedupe_key=dedupe_key,
        dedupe_window=None if dedupe_window is None else float(dedupe_window),
        concurrency_key=concurrency_key,
        trace_context=trace_context,
    )
    return snapshot


def values_to_transition(values: Sequence[Any]) -> Transition:
    try:
        return row_to_transition(dict(zip(TRANSITION_COLUMNS, values, strict=True)))
    except Exception as exc:
        raise unreadable(values, TRANSITION_COLUMNS, exc) from None


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "status": TaskStatus,
    "from_status": TaskStatus,
    "to_status": TaskStatus,
    "status_version": int,
    "version": int,
    "attempt": int,
    "priority": int,
    "dedupe_window": float,
    "tags": lambda value: decode_tags(value),
    "progress": lambda value: decode_progress(value),
    "failure": lambda value: decode_failure(value),
    "outcome": lambda value: decode_json(value),
    **{name: decode_dt for name in ("created_at", "started_at", "ended_at", "at")},
    **{name: decode_dt for name in ("last_heartbeat_at", "lease_until", "run_at")},
}
"""How each field of a row is read, one at a time: to name the one that is not."""


def values_to_command(values: Sequence[Any]) -> Command:
    return row_to_command(dict(zip(COMMAND_COLUMNS, values, strict=True)))


def late_report_to_values(report: LateReport) -> list[Any]:
    """A late report's row, in ``late_reports``' column order."""
    return [
        report.task_id,
        report.reported_by,
        encode_dt(report.reported_at),
        report.status.value,
        encode_dt(report.ended_at),
        None if report.outcome is None else encode_json(report.outcome),
        encode_failure(report.failure),
        report.stored_status.value,
    ]


def values_to_late_report(values: Sequence[Any]) -> LateReport:
    task_id, by, at, status, ended, outcome, failure, stored = values
    reported_at = decode_dt(at)
    if reported_at is None:
        raise ValueError(f"late report of {task_id} has no time")
    return LateReport(
        task_id=task_id,
        reported_by=by,
        reported_at=reported_at,
        status=TaskStatus(status),
        stored_status=TaskStatus(stored),
        ended_at=decode_dt(ended),
        outcome=None if outcome is None else decode_json(outcome),
        failure=decode_failure(failure),
    )
