"""Node-owned triggers: interval and cron schedules (no central scheduler exists).

Each firing is a normal ``submit`` with the schedule's bucket key and tags (plus
``schedule:<name>``), so it shows in ``ps`` and obeys bucket ownership. A schedule keeps
its next fire time in memory: schedules belong to the nodes that declare them, like task
definitions. Every node that declares a schedule reaches the same slots (the instants
its trigger is due); each slot creates one task in the whole store, under an id made
from the schedule's name and the slot (``slot_task_id``): the first node to reach it
fires it, the others find it taken. A schedule with a ``bucket_key`` fires only on the
node that owns the key's bucket.

Cron: five fields (minute hour day-of-month month day-of-week) with ``*``, ``a-b``,
``*/n``, ``a-b/n``, lists, month and weekday names, and ``@hourly`` ``@daily`` ``@weekly``
``@monthly`` ``@yearly``; when both day fields are restricted a day matching either fires
(as in Vixie cron). Times are wall-clock times in the trigger's time zone: a time that
does not exist (the spring-forward gap) fires at the same wall-clock time shifted past the
gap (02:30 -> 03:30), and a time that occurs twice (fall back) fires once, at its first
occurrence.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigurationError
from .model import utc

if TYPE_CHECKING:
    from .definitions import TaskRef
    from .run.handle import TaskRun
    from .run.stored import StoredTask

__all__ = [
    "CronTrigger",
    "IntervalTrigger",
    "Overlap",
    "Schedule",
    "Submit",
    "Trigger",
    "schedule_tags",
    "slot_task_id",
]

Overlap = Literal["skip", "allow"]


class Trigger(Protocol):
    def next_after(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (UTC)."""

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last fire time at or before ``moment`` (UTC), if any."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class IntervalTrigger:
    """Every ``seconds``, counted from ``start_at`` (default: 1970-01-01 UTC, so every
    node that defines the schedule reaches the same instants: ``IntervalTrigger(60)``
    is due at the start of each minute, and one firing per instant holds fleet-wide)."""

    def __init__(self, seconds: float, *, start_at: datetime | None = None) -> None:
        if seconds <= 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {seconds}")
        self.interval = timedelta(seconds=seconds)
        self.start_at = None if start_at is None else utc(start_at, "start_at")

    def __repr__(self) -> str:
        return f"IntervalTrigger({self.interval.total_seconds():g}s)"

    def __str__(self) -> str:
        return f"every {self.interval.total_seconds():g}s"

    def _anchor(self) -> datetime:
        return _EPOCH if self.start_at is None else self.start_at

    def next_after(self, after: datetime) -> datetime:
        anchor = self._anchor()
        if after < anchor:
            return anchor + self.interval
        steps = math.floor((after - anchor) / self.interval) + 1
        return anchor + steps * self.interval

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        anchor = self._anchor()
        if moment < anchor + self.interval:
            return None
        return anchor + math.floor((moment - anchor) / self.interval) * self.interval


_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, start=1)}
_DAYS = {n: i for i, n in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def _field(text: str, low: int, high: int, names: dict[str, int], what: str) -> set[int]:
    values: set[int] = set()
    for part in text.lower().split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                start, end = low, high
            else:
                a, dash, b = body.partition("-")
                start = names[a] if a in names else int(a)
                end = (names[b] if b in names else int(b)) if dash else start
                if step_text and not dash:
                    end = high
        except ValueError:
            raise ConfigurationError(f"cron {what} field {text!r}: {part!r} is not valid") from None
        if step < 1 or start < low or end > high or start > end:
            raise ConfigurationError(
                f"cron {what} field {text!r}: {part!r} is outside {low}-{high}"
            )
        values.update(range(start, end + 1, step))
    return values


class CronTrigger:
    """A five-field cron expression evaluated in ``timezone`` (an IANA name or tzinfo)."""

    def __init__(self, expression: str, *, timezone: str | tzinfo = "UTC") -> None:
        self.expression = expression
        text = _MACROS.get(expression.strip().lower(), expression)
        parts = text.split()
        if len(parts) != 5:
            raise ConfigurationError(
                f"cron expression {expression!r} needs 5 fields "
                "(minute hour day-of-month month day-of-week)"
            )
        self.minutes = sorted(_field(parts[0], 0, 59, {}, "minute"))
        self.hours = sorted(_field(parts[1], 0, 23, {}, "hour"))
        self.days = _field(parts[2], 1, 31, {}, "day-of-month")
        self.months = _field(parts[3], 1, 12, _MONTHS, "month")
        weekdays = _field(parts[4], 0, 7, _DAYS, "day-of-week")
        self.weekdays = {d % 7 for d in weekdays}  # 7 is Sunday too
        self._dom_any = parts[2] == "*"
        self._dow_any = parts[4] == "*"
        if isinstance(timezone, str):
            try:
                self.tz: tzinfo = ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ConfigurationError(f"unknown time zone {timezone!r}") from None
        else:
            self.tz = timezone

    def __repr__(self) -> str:
        return f"CronTrigger({self.expression!r}, timezone={self.tz})"

    def __str__(self) -> str:
        return f"cron '{self.expression}' ({self.tz})"

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self._dom_any and self._dow_any:
            return True
        if self._dom_any:
            return dow
        if self._dow_any:
            return dom
        return dom or dow

    def _times(self, day: date) -> list[datetime]:
        return [
            datetime(day.year, day.month, day.day, h, m, tzinfo=self.tz).astimezone(UTC)
            for h in self.hours
            for m in self.minutes
        ]

    def next_after(self, after: datetime) -> datetime:
        day = utc(after).astimezone(self.tz).date() - timedelta(days=1)
        for _ in range(366 * 8 + 2):
            if self._day_matches(day):
                later = [t for t in self._times(day) if t > after]
                if later:
                    return min(later)
            day += timedelta(days=1)
        raise ConfigurationError(f"cron expression {self.expression!r} never fires")

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        day = utc(moment).astimezone(self.tz).date() + timedelta(days=1)
        for _ in range(366 * 8 + 2):
            if self._day_matches(day):
                earlier = [t for t in self._times(day) if t <= moment]
                if earlier:
                    return max(earlier)
            day -= timedelta(days=1)
        return None


@dataclass(kw_only=True, eq=False)
class Schedule:
    """A trigger bound to a task on this node, with its firing record."""

    name: str
    task: TaskRef
    trigger: Trigger
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    overlap: Overlap = "skip"
    misfire_grace: float | None = None
    jitter: float = 0.0
    bucket_key: str | None = None
    tags: frozenset[str] = frozenset()
    priority: int = 0
    dedupe_key: str | None = None
    """Each firing's: a firing whose key a task still holds answers with that task."""
    task_name: str | None = None
    """The name of the task it fires (set by the controller, which resolves ``task``)."""
    next_fire: datetime | None = None
    """The next slot: the instant the trigger is next due (the same on every node)."""
    due: datetime | None = None
    """When this node reaches it: ``next_fire`` plus its jitter."""
    last_run: TaskRun | StoredTask | None = None
    """The task of the last slot reached, fired here or by another node."""
    last_fired: datetime | None = None
    fired: int = 0
    """Slots this node fired."""
    taken: int = 0
    """Slots another node defining the schedule fired first (this node then did not)."""
    last_taken_by: str | None = None
    skipped_overlap: int = 0
    skipped_misfire: int = 0
    skipped_elsewhere: int = 0
    """Slots left to the owner of the schedule's bucket, another node."""

    def __post_init__(self) -> None:
        if self.overlap not in ("skip", "allow"):
            raise ConfigurationError(f"schedule {self.name}: overlap is 'skip' or 'allow'")
        if self.jitter < 0 or (self.misfire_grace is not None and self.misfire_grace < 0):
            raise ConfigurationError(f"schedule {self.name}: jitter and grace must be >= 0")

    @property
    def active(self) -> bool:
        """Whether the run this schedule fired last is still going."""
        return self.last_run is not None and not self.last_run.done()


def schedule_tags(name: str, tags: Iterable[str]) -> frozenset[str]:
    return frozenset(tags) | {f"schedule:{name}"}


def slot_task_id(schedule: str, slot: datetime) -> str:
    """The id of the one task a slot of ``schedule`` creates in the whole store: the same
    on every node, so the store's refusal of a second task with one id makes one firing
    per slot (docs/design.md, "One firing per slot"). 32 hex digits, as any task id."""
    text = f"schedule\x00{schedule}\x00{utc(slot).isoformat()}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


Submit = Callable[[Schedule, datetime], "TaskRun | StoredTask | None"]
"""Submits the firing of a schedule's slot (the controller's ``submit`` with its tags,
under the slot's task id); ``None`` when another node fired the slot first."""
