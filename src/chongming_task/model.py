"""The records: task snapshots, transitions, commands, queries.

All records are frozen, keyword-only dataclasses changed with ``dataclasses.replace``.
Datetimes are UTC-aware; a naive datetime is rejected at construction, an aware one in
another zone is normalised to UTC so that every record compares and sorts the same way in
every process. Legality of status changes lives in ``states``, not here.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ._fast_records import make_builder, make_changer, make_evolver
from .errors import InvalidValue
from .health import NodeHealth
from .text import utf8_fault

__all__ = [
    "BRIEF_MESSAGE",
    "Command",
    "CommandAction",
    "ControlOutcome",
    "ControlReceipt",
    "Failure",
    "FailureKind",
    "JSONValue",
    "NodeRecord",
    "PipelineRecord",
    "Progress",
    "ScheduleRecord",
    "TaskQuery",
    "TaskScan",
    "TaskSnapshot",
    "TaskStatus",
    "Transition",
    "snapshot_changer",
    "submitted_snapshot",
    "trusted_snapshot",
    "trusted_transition",
    "utc",
]

JSONValue = Any
"""A value ``json.dumps(..., allow_nan=False)`` accepts: what task results must be."""


class TaskStatus(enum.StrEnum):
    """Where a task is in its life. Stored by ``.value``."""

    PENDING = "pending"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.STOPPED,
        TaskStatus.CANCELLED,
        TaskStatus.LOST,
    }
)
"""Read through ``states.TERMINAL``; here so ``is_terminal`` needs no import per call."""


class FailureKind(enum.StrEnum):
    """Why a task failed (or was lost). Stored by ``.value``."""

    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    RESULT_INVALID = "result_invalid"
    LOST = "lost"
    DEPENDENCY = "dependency"
    ABANDONED = "abandoned"
    """Asked to stop, its carrier did not end in time and may still run (a coroutine
    that refused its cancellation): the task ended as asked, ``carrier_may_run``."""
    CRASHED = "crashed"
    """The worker process carrying it died on its own (a signal, an exit, the OOM
    killer); the message names how."""


class CommandAction(enum.StrEnum):
    """What a cross-process command asks the holder of a task to do."""

    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


def utc(value: datetime, what: str = "datetime") -> datetime:
    """Return ``value`` in UTC; reject naive datetimes, whose zone is a guess."""
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (got naive {value.isoformat()})")
    return value.astimezone(UTC)


def _normalise(record: object, names: Iterable[str]) -> None:
    for name in names:
        value = getattr(record, name)
        if value is not None and value.tzinfo is not UTC:
            object.__setattr__(record, name, utc(value, name))


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """How far a task has come. ``total=None`` means the end is unknown."""

    current: float = 0.0
    total: float | None = None
    message: str | None = None

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return max(0.0, min(1.0, self.current / self.total))


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """Why a task did not succeed.

    ``carrier_may_run`` is the honest part: after a timeout that the task ignored, a
    cancellation a coroutine refused, or a lost supervisor, the code may still be running
    somewhere (threads cannot be killed; a coroutine can refuse to end).
    """

    kind: FailureKind
    message: str
    exception_type: str | None = None
    carrier_may_run: bool = False
    traceback: str | None = None
    """The exception's traceback as Python prints it (its last lines when very long)."""


_SNAPSHOT_TIMES = (
    "created_at", "started_at", "ended_at", "last_heartbeat_at", "lease_until", "run_at"
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSnapshot:
    """The state of one task as one process knows it.

    ``status_version`` grows by one per transition but the store may skip versions (a
    write-through catch-up jumps several at once). ``lease_owner`` / ``lease_until`` are
    written only through ``TaskStore.touch`` by the supervising process; ``save`` never
    writes them.
    """

    task_id: str
    name: str
    status: TaskStatus
    status_version: int
    created_at: datetime
    attempt: int = 0
    tags: frozenset[str] = frozenset()
    bucket: int | None = None
    bucket_key: str | None = None
    pipeline_run_id: str | None = None
    owner: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    progress: Progress | None = None
    failure: Failure | None = None
    outcome: JSONValue = None
    lease_owner: str | None = None
    lease_until: datetime | None = None
    # How it was submitted (``node.options``), fixed at create:
    run_at: datetime | None = None
    """Not started before this time (a delayed task); ``None``: as soon as it can."""
    priority: int = 0
    """Higher first in its node's queue; first come, first served within one priority."""
    dedupe_key: str | None = None
    """At most one unfinished task in the store holds it (``dedupe_window``: and a
    success holds it that many seconds more)."""
    dedupe_window: float | None = None
    concurrency_key: str | None = None
    """Its definition's ``max_per_key`` counts the running tasks sharing it."""
    trace_context: str | None = None
    """The W3C trace context its submit was made in (``traceparent``, then, if any, a
    space and ``tracestate``), kept by an instrumented node (``chongming_task.otel``): its
    attempts' spans join that trace, and other processes' controls link to it."""

    def __post_init__(self) -> None:
        _normalise(self, _SNAPSHOT_TIMES)
        if not isinstance(self.tags, frozenset):
            object.__setattr__(self, "tags", frozenset(self.tags))

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    if TYPE_CHECKING:  # made below (``_fast_records.make_evolver``)

        def evolve(self, **changes: Any) -> TaskSnapshot: ...


_SNAPSHOT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TaskSnapshot))
# The builders are generated (``_fast_records``: the figure that pays for them is there).
TaskSnapshot.evolve = make_evolver(  # type: ignore[method-assign]  # declared above
    TaskSnapshot, _SNAPSHOT_FIELDS, _SNAPSHOT_TIMES, utc=utc, zone=UTC
)
trusted_snapshot = make_builder(TaskSnapshot, _SNAPSHOT_FIELDS)
"""Build a ``TaskSnapshot`` from already-normalised values (store codecs only)."""


@functools.cache
def snapshot_changer(changed: tuple[str, ...]) -> Callable[..., TaskSnapshot]:
    """``TaskSnapshot.evolve`` made for one set of changed fields, their new values
    given positionally in ``changed``'s order: ``snapshot_changer(("status",))(s, x)``
    is ``s.evolve(status=x)``, with the same checks. An unknown name is a
    ``ValueError``."""
    return make_changer(TaskSnapshot, _SNAPSHOT_FIELDS, changed, _SNAPSHOT_TIMES, utc=utc, zone=UTC)


_UNSET_AT_SUBMIT = ("started_at", "ended_at", "last_heartbeat_at", "progress", "failure", "outcome")
_SET_AT_SUBMIT = {"status_version": "1", "attempt": "0", "lease_owner": "owner"}
submitted_snapshot: Callable[..., TaskSnapshot] = make_builder(
    TaskSnapshot,
    _SNAPSHOT_FIELDS,
    positional=tuple(
        f for f in _SNAPSHOT_FIELDS if f not in _SET_AT_SUBMIT and f not in _UNSET_AT_SUBMIT
    ),
    fixed=_SET_AT_SUBMIT,
)
"""A new task's ``TaskSnapshot`` from already-normalised values (UTC times, frozenset
tags), given positionally: ``task_id, name, status, created_at, tags, bucket,
bucket_key, pipeline_run_id, owner, lease_until, run_at, priority, dedupe_key,
dedupe_window, concurrency_key, trace_context``. Version 1, attempt 0, leased by its owner, nothing
started, reported or ended (the submit path)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One status change, appended to the audit trail. ``from_status=None`` is creation."""

    task_id: str
    version: int
    from_status: TaskStatus | None
    to_status: TaskStatus
    at: datetime
    reason: str | None = None
    actor: str | None = None

    def __post_init__(self) -> None:
        if self.at.tzinfo is not UTC:  # one per transition: keep the common case cheap
            object.__setattr__(self, "at", utc(self.at, "at"))


trusted_transition = make_builder(Transition, tuple(f.name for f in fields(Transition)))
"""Build a ``Transition`` whose ``at`` is already UTC (the runtime's own transitions)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRecord:
    """A worker node's declaration in the store, for audit and alarms only: it never
    decides who runs what (docs/design.md, "Fleet declarations").

    ``buckets`` is ``None`` for a node that declares no partition (it looks after every
    bucket). The node is live while it was seen within ``ttl_seconds`` and has not
    stopped.
    """

    node: str
    buckets: frozenset[int] | None
    num_buckets: int
    ttl_seconds: float
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None = None
    host: str = ""
    pid: int = 0
    health: NodeHealth | None = None
    """What the node last said of its health (``None``: it said nothing)."""

    def __post_init__(self) -> None:
        _normalise(self, ("started_at", "seen_at", "stopped_at"))
        if self.buckets is not None and not isinstance(self.buckets, frozenset):
            object.__setattr__(self, "buckets", frozenset(self.buckets))

    def is_live(self, now: datetime) -> bool:
        return self.stopped_at is None and (now - self.seen_at).total_seconds() <= self.ttl_seconds

    @property
    def covers_all(self) -> bool:
        """No partition: no buckets declared, or every bucket (bucketless tasks too)."""
        return self.buckets is None or len(self.buckets) >= self.num_buckets


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRecord:
    """A schedule as its node declares it in the store, for people (the CLI's
    ``schedules``): what it fires, on which trigger, when next and when last. Schedules
    belong to their node; nothing reads this record to decide a firing, and a schedule
    fires only while its node runs."""

    node: str
    name: str
    task: str
    trigger: str
    updated_at: datetime
    next_fire_at: datetime | None = None
    last_fired_at: datetime | None = None
    last_task_id: str | None = None
    fired: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        _normalise(self, ("updated_at", "next_fire_at", "last_fired_at"))


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRecord:
    """A submitted pipeline run's shape, for people (the dashboard draws it): which task
    each node key became and which keys it waits for. The graph that drives the run lives
    in the submitting process; nothing reads this record to decide anything."""

    pipeline_run_id: str
    name: str
    node: str
    """The node that submitted the run (it alone drives it)."""
    created_at: datetime
    tasks: Mapping[str, str]
    """Node key -> task id."""
    depends_on: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        _normalise(self, ("created_at",))


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """A control request for a task held by another process.

    The store only carries it; the holder claims it (with a lease), acts, and completes it
    with an ``outcome``. ``issued_by`` is the requesting controller's ``owner``.
    """

    command_id: str
    task_id: str
    action: CommandAction
    created_at: datetime
    issued_by: str | None = None
    reason: str | None = None
    lease_until: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None

    def __post_init__(self) -> None:
        _normalise(self, ("created_at", "lease_until", "finished_at"))


BRIEF_MESSAGE = 200
"""Characters of a progress message a ``brief`` query keeps (a list shows no more)."""


_TEXT_FILTERS = (
    "id_prefix",
    "name",
    "name_prefix",
    "name_glob",
    "tag",
    "pipeline_run_id",
    "pipeline_prefix",
    "owner",
    "dedupe_key",
)


def _creation(s: TaskSnapshot) -> tuple[datetime, str]:
    return s.created_at, s.task_id


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskQuery:
    """Filters for ``TaskStore.query``; every filter set must hold (AND).

    ``name_glob`` matches names as ``fnmatch.fnmatchcase`` (``etl.*``; without wildcards,
    one name). ``tag`` matches one tag exactly (``io`` never matches ``ios``). ``id_prefix`` and
    ``pipeline_prefix`` select the tasks whose id, or pipeline run id, starts with the
    text (how the CLI resolves a short id). ``owner`` keeps the tasks of one node (the
    process that runs them). ``created_until`` keeps tasks created at or before that time.
    Results are ordered by ``created_at`` ascending, ties by ``task_id``, and exactly
    reversed with ``newest_first``; ``after`` keeps the tasks past that ``(created_at,
    task_id)`` in that order (the next page, however many tasks share one instant).
    ``brief`` is for lists: a store may leave out each task's result and its failure's
    traceback (``None``) and cut a progress message to ``BRIEF_MESSAGE`` characters; a
    store that reads them at no cost may keep them.
    """

    statuses: frozenset[TaskStatus] | None = None
    id_prefix: str | None = None
    name: str | None = None
    name_prefix: str | None = None
    name_glob: str | None = None
    tag: str | None = None
    buckets: frozenset[int] | None = None
    pipeline_run_id: str | None = None
    pipeline_prefix: str | None = None
    owner: str | None = None
    dedupe_key: str | None = None
    created_until: datetime | None = None
    limit: int | None = None
    newest_first: bool = False
    after: tuple[datetime, str] | None = None
    brief: bool = False

    def __post_init__(self) -> None:
        if self.statuses is not None and not isinstance(self.statuses, frozenset):
            object.__setattr__(self, "statuses", frozenset(TaskStatus(s) for s in self.statuses))
        if self.buckets is not None and not isinstance(self.buckets, frozenset):
            object.__setattr__(self, "buckets", frozenset(self.buckets))
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")
        _normalise(self, ("created_until",))
        if self.after is not None:
            at, task_id = self.after
            object.__setattr__(self, "after", (utc(at, "after"), task_id))
        if self.id_prefix == "" or self.pipeline_prefix == "":
            raise ValueError("an id prefix must not be empty")
        for name, value in self.texts():
            if utf8_fault(value) is not None:
                raise InvalidValue(f"query {name} is not valid UTF-8 text: {value!a}")

    def texts(self) -> Iterator[tuple[str, str]]:
        """Each text the query filters by, with its field's name (``after``'s task id
        too): what a store must be able to send."""
        for name in _TEXT_FILTERS:
            value = getattr(self, name)
            if value is not None:
                yield name, value
        if self.after is not None:
            yield "after", self.after[1]

    def matches(self, snapshot: TaskSnapshot) -> bool:
        """Whether ``snapshot`` passes every filter (ordering and limit aside)."""
        return (
            (self.statuses is None or snapshot.status in self.statuses)
            and (self.id_prefix is None or snapshot.task_id.startswith(self.id_prefix))
            and (self.name is None or snapshot.name == self.name)
            and (self.name_prefix is None or snapshot.name.startswith(self.name_prefix))
            and (self.name_glob is None or fnmatchcase(snapshot.name, self.name_glob))
            and (self.tag is None or self.tag in snapshot.tags)
            and (self.buckets is None or snapshot.bucket in self.buckets)
            and (self.pipeline_run_id is None or snapshot.pipeline_run_id == self.pipeline_run_id)
            and (
                self.pipeline_prefix is None
                or (snapshot.pipeline_run_id or "").startswith(self.pipeline_prefix)
            )
            and (self.owner is None or snapshot.owner == self.owner)
            and (self.dedupe_key is None or snapshot.dedupe_key == self.dedupe_key)
            and (self.created_until is None or snapshot.created_at <= self.created_until)
            and (
                self.after is None
                or (
                    (snapshot.created_at, snapshot.task_id) < self.after
                    if self.newest_first
                    else (snapshot.created_at, snapshot.task_id) > self.after
                )
            )
        )

    def ordered(self, found: list[TaskSnapshot]) -> list[TaskSnapshot]:
        """``found`` (the tasks that match) in the query's order, cut to its ``limit``:
        for a store that filters with ``matches``."""
        found.sort(key=_creation, reverse=self.newest_first)
        return found if self.limit is None else found[: self.limit]


class ControlOutcome(enum.StrEnum):
    """What a stop / pause / resume / cancel did. Stored by ``.value`` as a command's
    ``outcome``."""

    ACCEPTED = "accepted"
    """A command was written for the process that holds the task: request accepted."""
    STOPPING = "stopping"
    CANCELLED = "cancelled"
    PAUSING = "pausing"
    PAUSE_PENDING = "pause-pending"
    """Not started yet (``status`` says queued): it pauses as soon as it starts."""
    RESUMED = "resumed"
    ALREADY_TERMINAL = "already-terminal"
    ALREADY_STOPPING = "already-stopping"
    ALREADY_PAUSED = "already-paused"
    NOT_PAUSED = "not-paused"
    UNKNOWN_TASK = "unknown-task"
    """(A command's outcome only) no such task in the store."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlReceipt:
    """What a control call (stop/pause/resume/cancel) did.

    ``accepted`` means a command was written for the process that holds the task: the
    request is accepted, not yet carried out. Otherwise ``outcome`` says what happened
    here and now (``stopping``, ``pausing``, ``already-terminal``, ...). ``status`` is the
    task's status when the call was answered (its final one for ``already-terminal``;
    still ``queued`` for ``pause-pending``, which the run turns into ``paused`` once it
    starts).
    ``behind`` is the action of the pending command an accepted one was queued behind
    (it is judged after that one), if any. ``woken``: the store wakes the holder as the
    command is written (else the holder finds it at its next poll).
    """

    task_id: str
    action: CommandAction
    outcome: ControlOutcome
    command_id: str | None = None
    status: TaskStatus | None = None
    behind: CommandAction | None = None
    woken: bool = False

    @property
    def accepted(self) -> bool:
        return self.command_id is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskScan:
    """A question about many tasks, answered by a count and the oldest few: the fleet
    checks and ``reconcile()``. Every filter set must hold.

    ``outside`` keeps bucketless tasks and tasks in none of the given buckets;
    ``lease_expired_at`` keeps tasks whose lease is unset or ended by then;
    ``unchanged_since`` keeps tasks whose last status change (their trail's row for the
    current version, else ``created_at``) is at or before it. ``limit`` bounds the tasks
    returned (``None``: all of them), never the count.
    """

    statuses: frozenset[TaskStatus]
    buckets: frozenset[int] | None = None
    outside: frozenset[int] | None = None
    lease_expired_at: datetime | None = None
    unchanged_since: datetime | None = None
    limit: int | None = 20

    def __post_init__(self) -> None:
        _normalise(self, ("lease_expired_at", "unchanged_since"))
        for name in ("statuses", "buckets", "outside"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, frozenset):
                object.__setattr__(self, name, frozenset(value))
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")

    def matches(self, s: TaskSnapshot) -> bool:
        """Every filter but ``unchanged_since`` (which needs the trail)."""
        return (
            s.status in self.statuses
            and (self.buckets is None or s.bucket in self.buckets)
            and (self.outside is None or s.bucket is None or s.bucket not in self.outside)
            and (
                self.lease_expired_at is None
                or s.lease_until is None
                or s.lease_until <= self.lease_expired_at
            )
        )
