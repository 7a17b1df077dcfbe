"""The store contract beyond ``TaskStore``'s 14 methods, in four roles, and the few
traits a store may declare on its own.

A store declares a role by having *all* of its methods (no inheritance, no
registration); a store with part of a role declares none of it, and the node uses that
role's fallback over the 14 methods (``chongming_task.stores.capabilities``). A role is
proved by its section of ``chongming_task.testing.store_contract.StoreContract``, which
runs only for the roles the store declares. ``docs/stores.md`` gives each role's why.

- ``BatchedWrites``: many rows in one transaction (creates, a run's writes, leases,
  activity, reconcile's marks, dedupe keys).
- ``CommandChannel``: wake-ups, claims addressed to a holder, a task's open commands, the
  finished ones, and the holds of a pause before a task's start.
- ``FleetRegistry``: what nodes declare (themselves, their schedules, their pipelines).
- ``Maintenance``: questions about many tasks, reconcile in one step, retention, late
  reports.

Traits, each declared alone: ``SupportsAtomic``, ``DeclaresValueRules``,
``SupportsStorageClock``, ``SupportsConnectionCount``, ``SupportsCreateSchema``,
``SupportsResultPreview``.

And the rules a store may reuse to meet a contract: commands in arrival order
(``in_arrival_order``), the holder of a dedupe key (``dedupe_holder``), retention's and
the timeline's checks, the marks that end a task (``ended_mark``, ``lost_mark``),
``Settled`` writes, ``ReadWhole``: counts, scans and the timeline through the core, and
``previewed``: a task read with its result cut to a preview.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from .. import states
from ..errors import StoreError
from ..health import NodeHealth
from ..late import LateReport
from ..model import (
    Command,
    Failure,
    NodeRecord,
    PipelineRecord,
    Progress,
    ScheduleRecord,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
    trusted_transition,
)
from ..states import TERMINAL
from ..values import STRICT, ValueRules
from .codec import decode_dt
from .protocol import TaskStore

__all__ = [
    "PREVIEW",
    "ROLES",
    "Activity",
    "BatchedWrites",
    "CommandChannel",
    "CountBy",
    "Creation",
    "DeclaresValueRules",
    "FleetRegistry",
    "LifeWrite",
    "Maintenance",
    "PartialCreate",
    "PartialWrite",
    "PendingWrites",
    "Previewed",
    "ReadWhole",
    "Settled",
    "SupportsAtomic",
    "SupportsConnectionCount",
    "SupportsCreateSchema",
    "SupportsResultPreview",
    "SupportsStorageClock",
    "Verdict",
    "check_retention_args",
    "check_timeline_args",
    "dedupe_holder",
    "ended_mark",
    "in_arrival_order",
    "lost_mark",
    "mark_expired_by_scan",
    "previewed",
    "roles_of",
    "rules_of",
    "timeline_of",
]

Creation = tuple[TaskSnapshot, Transition]
"""A task to create and its creation transition; also a mark: an ended snapshot and the
transition that ends it."""
LifeWrite = tuple[TaskSnapshot, int, Sequence[Transition]]
"""One task's ``write_transitions``: the snapshot, the version expected, the trail."""
Verdict = Callable[[str | None], tuple[Failure, str]]
"""For a lease owner (``None``: none), the failure and the trail reason of its lost tasks."""
Activity = tuple[str, Progress | None, datetime | None]
"""One task's activity to write: its id, progress and heartbeat (``None``: as is)."""
CountBy = Literal["status", "bucket", "owner", "lease_owner", "bucket_status"]
"""A column to count tasks by; ``bucket_status`` counts per ``(bucket, status)`` pair."""


class PendingWrites(Protocol):
    """Writes a store has queued (``write_transitions_behind``) and not yet committed."""

    @property
    def settled(self) -> bool:
        """Whether every write is committed or has failed (``errors`` is then final)."""
        ...

    @property
    def queued_at(self) -> float:
        """When the writes were queued (``time.monotonic()``)."""
        ...

    def errors(self) -> list[BaseException | None]:
        """Each write's error (``None``: committed), in order; once ``settled``."""
        ...

    def serve(self) -> None:
        """Commit them now if the store is free (never waits); else they ride the commit
        of whoever has it."""
        ...

    def wait(self) -> None:
        """Commit them (or wait for whoever is committing them) and return once settled."""
        ...


class Settled:
    """``PendingWrites`` already written: what a store without group commit returns from
    ``write_transitions_behind`` after writing at once."""

    __slots__ = ("_errors", "queued_at")

    def __init__(self, errors: list[BaseException | None]) -> None:
        self._errors = errors
        self.queued_at = time.monotonic()

    @property
    def settled(self) -> bool:
        return True

    def errors(self) -> list[BaseException | None]:
        return self._errors

    def serve(self) -> None:
        return None

    def wait(self) -> None:
        return None


# -- the roles ----------------------------------------------------------------------------------


@runtime_checkable
class BatchedWrites(Protocol):
    """Writes of many rows in one transaction: what a node writes for every task it
    submits and runs. Without this role each write is the 14 methods' calls one by one
    (inside ``atomic()`` where the store has it)."""

    group_commit: bool
    """True: the store commits writes made side by side together (one statement, one
    commit), so two writes issued at once cost about one; the node's workers then queue
    their runs' writes with ``write_transitions_behind`` and go on. False: every worker
    writes its own run's writes and waits for them."""

    def create_many(self, items: Sequence[Creation]) -> None:
        """``create`` every snapshot and ``append`` its creation transition, in one
        transaction: all or nothing. An existing id raises ``TaskAlreadyExists`` with
        nothing of the batch stored."""
        ...

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """``create(snapshot)`` and ``append(created)`` in one transaction, unless
        ``snapshot.dedupe_key`` is held: by an unfinished task, or by one that succeeded
        less than its own ``dedupe_window`` seconds before ``snapshot.created_at``.
        Returns ``None`` once created, else the id of the task holding the key (nothing
        written). Atomic across processes: of any number of callers racing with one
        key, one creates. A snapshot without a key is a ``ValueError``."""
        ...

    def write_transitions(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        """Compare-and-set the columns a task's life changes (status, version, attempt,
        times, progress, failure, outcome; never the identity columns fixed at
        ``create``, owner among them, never the lease) where the stored version is
        ``expect_version``, and ``append`` the transitions, in one transaction. A
        conflict raises ``ConcurrencyConflict`` with nothing written."""
        ...

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """``write_transitions`` for several tasks (each at most once) in one call, so
        a store that commits writes made side by side together commits them in one
        statement. Each write stands alone: its own compare-and-set, all of it or none
        of it; one write's conflict or bad value never fails another. Returns each
        write's error (``None``: committed), in order; raises nothing for one write."""
        ...

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> PendingWrites:
        """``write_transitions_together``, queued and not waited for: returns at once,
        having committed nothing (unless the caller is inside ``atomic()``: then written
        there). The writes ride the next commit made on this store (another caller's),
        or ``serve()`` / ``wait()`` on what is returned commits them. Each write stands
        alone. A store without group commit may write at once and return ``Settled``."""
        ...

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> list[str]:
        """Set ``lease_owner`` and ``lease_until`` of every task in ``task_ids`` (as
        ``touch`` does; nothing else), in one transaction: all or nothing. A task not
        stored, finished (a terminal status) or held by another owner (``lease_owner``
        set and not ``owner``) is left as is. Returns the ids renewed."""
        ...

    def write_activity(self, items: Sequence[Activity], *, owner: str) -> list[str]:
        """For each ``(task_id, progress, heartbeat_at)``: set the given columns
        (``None``: as is), as ``touch`` does, in one transaction. A task not stored,
        finished or held by another owner is left as is. Returns the ids written."""
        ...

    def mark_lost(self, marks: Sequence[Creation]) -> set[str]:
        """For each ``(lost snapshot, its transition)``: compare-and-set ``status``,
        ``status_version``, ``ended_at`` and ``failure`` where the stored version is
        ``transition.version - 1``, and append the transition only where that won.
        Returns the ids marked; the others moved on (their holder is alive)."""
        ...


@runtime_checkable
class CommandChannel(Protocol):
    """How commands reach the node that holds their task, at once rather than at the
    next poll, and what a control must know of the commands still open. Without this
    role the node polls every 0.5 s, claims every command and gives back what it does not
    hold, and writes every pause and resume for the holder to judge."""

    def subscribe_commands(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake()`` soon after any process submits a command, and once after any
        gap in which one could have been missed (a reconnect): polling stays the truth,
        as a slow safety net. Returns a function that unsubscribes, or ``None`` where
        this store cannot wake its subscribers (they then poll often)."""
        ...

    def subscribe_commands_for(
        self, holder: str, wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        """``subscribe_commands``, for the commands ``holder`` may claim
        (``claim_commands_for``'s) and after a gap; waking it for another holder's
        commands too is allowed, missing its own is not."""
        ...

    def claim_commands_for(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """``claim_commands``, among the commands one node may act on: those of tasks
        whose ``lease_owner`` is ``holder``, and those of tasks nobody holds (not stored,
        finished, or never leased). A task's commands are all in or all out, so their
        order holds; a fleet's nodes never claim, and release, each other's."""
        ...

    def pending_commands(self, task_id: str) -> list[Command]:
        """The unfinished commands of ``task_id`` (claimed or not), in the order the
        store received them: a control sent while one is pending is judged after it."""
        ...

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """Commands whose ``finished_at`` is after ``after``, oldest finish first, at most
        ``limit`` (how long controls took to be carried out)."""
        ...

    def subscribe_transitions(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake()`` soon after any process appends transitions (for followers
        such as the dashboard: polling stays the truth). Returns a function that
        unsubscribes, or ``None`` where this store cannot wake them."""
        ...

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        """Keep that ``by`` (a node) holds ``task_id`` since ``since``: a pause landed
        before the task started, its status stays ``queued`` or ``pending``, and every
        process must see it waits for a resume. A later hold of the task replaces it;
        pruned with its task."""
        ...

    def release_hold(self, task_id: str) -> None:
        """Forget the task's hold, if any."""
        ...

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        """Each held task of ``task_ids`` (``None``: any, the oldest holds first, at most
        ``limit``) and since when."""
        ...


@runtime_checkable
class FleetRegistry(Protocol):
    """What each node declares, for people and alarms: the node itself (its buckets, when
    it was last seen, its health), its schedules, and the shape of each pipeline run.
    Nothing reads them to run a task. Without this role nothing is declared: ``nodes``
    and ``schedules`` say so and the dashboard draws no pipeline graph."""

    def declare_node(self, record: NodeRecord) -> None:
        """Write ``record`` in place of any earlier declaration of the same node, its
        buckets replaced, ``stopped_at`` cleared."""
        ...

    def refresh_node(self, node: str, *, now: datetime, health: NodeHealth | None = None) -> bool:
        """Set the node's ``seen_at`` to ``now`` (the store's own clock where it has
        one), and its ``health`` where given (``None``: as it was). ``False`` if the node
        has no declaration or has stopped (declare again)."""
        ...

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        """``refresh_node``, and how many open commands no claim's lease holds (by the
        new ``seen_at``) that ``node`` may claim (``claim_commands_for``'s), in one
        transaction: the poller's safety net rides on the beacon. ``None`` where
        ``refresh_node`` would answer ``False`` (declare again)."""
        ...

    def retire_node(self, node: str, *, now: datetime) -> None:
        """Mark the node stopped at ``now`` (a clean close); its record stays."""
        ...

    def nodes(self) -> list[NodeRecord]:
        """Every declaration, live or not."""
        ...

    def declare_schedule(self, record: ScheduleRecord) -> None:
        """Write ``record`` in place of the node's earlier record of the same name."""
        ...

    def forget_schedule(self, node: str, name: str) -> None:
        """Remove the node's record of schedule ``name`` (nothing if there is none)."""
        ...

    def schedules(self) -> list[ScheduleRecord]:
        """Every schedule record, ordered by node then name."""
        ...

    def record_pipeline(self, record: PipelineRecord) -> None:
        """Keep ``record`` (a run is recorded once; recording it again replaces it)."""
        ...

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        """The run's record, or ``None``."""
        ...

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        """The newest ``limit`` records, newest first."""
        ...


@runtime_checkable
class Maintenance(Protocol):
    """Work over many tasks done inside the store, so a tool's time and memory do not
    grow with it: counts and scans, reconcile in one step, retention by age, and the
    late reports kept beside their tasks. Without this role the node reads the tasks
    through ``query()`` and ``history()``, marks the lost ones one by one, cannot prune
    by age, and keeps late reports only in its log."""

    def count_tasks(
        self, by: CountBy, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        """Tasks per value of the column ``by`` (``None`` a value like any other),
        among ``statuses`` (``None``: all). Values with no task are absent."""
        ...

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        """How many tasks ``scan`` keeps, and the first ``scan.limit`` of them, oldest
        (``created_at``, then insertion) first."""
        ...

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """Finished tasks that ended at or after ``since``, per ``(slot, status)``: slot
        ``k`` holds those that ended in ``[since + k * width, since + (k + 1) * width)``,
        to the microsecond. Pairs with no task are absent. A naive ``since`` or a
        ``width`` under a microsecond is a ``ValueError``."""
        ...

    def mark_expired_lost(
        self,
        scan: TaskScan,
        *,
        exclude: frozenset[str],
        at: datetime,
        actor: str,
        verdict: Verdict,
    ) -> list[str]:
        """``reconcile()`` in the store: every task ``scan`` keeps (``lease_expired_at``
        says by when), but those in ``exclude``, goes to ``lost`` with version + 1,
        ``ended_at = at`` and ``verdict(lease_owner)``'s failure, and gets its trail row
        (from its status, the verdict's reason, ``actor``). The judgement and each
        compare-and-set are one step: a task whose holder writes meanwhile is left
        alone. A scan asking for a move the state table forbids is a ``ValueError``.
        Returns the ids marked."""
        ...

    def prune_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
        limit: int = 500,
    ) -> int:
        """Delete at most ``limit`` finished tasks that ended before ``before``, oldest
        first, with their trail, late reports and finished commands; ``statuses``
        (finished ones; default all) and ``buckets`` (default any) narrow the choice.
        Returns how many went; fewer than ``limit``: none is left. One short
        transaction a call. An unfinished status, a naive ``before`` or a ``limit``
        below 1 is a ``ValueError``."""
        ...

    def count_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
    ) -> int:
        """How many tasks ``prune_ended`` would delete, all batches together."""
        ...

    def prune_finished_commands(self, *, before: datetime, limit: int = 500) -> int:
        """Delete at most ``limit`` commands that finished before ``before`` (whatever
        became of their task), oldest first, in one short transaction; returns how many
        went (fewer than ``limit``: none is left). Open commands are never deleted."""
        ...

    def count_finished_commands(self, *, before: datetime) -> int:
        """How many commands ``prune_finished_commands`` would delete."""
        ...

    def record_late_report(self, report: LateReport) -> None:
        """Keep what a node reported of a task after the store had ended it without it,
        beside the task, never changing it (one per task: a later report replaces it);
        pruned with its task."""
        ...

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        """The reports of ``task_ids`` (``None``: of every task), the newest first, at
        most ``limit``."""
        ...

    def count_late_reports(self) -> int:
        """How many reports are kept."""
        ...


ROLES: tuple[type, ...] = (BatchedWrites, CommandChannel, FleetRegistry, Maintenance)
"""The four roles, in the order ``docs/stores.md`` gives them."""


def roles_of(store: object) -> list[str]:
    """The names of the roles ``store`` declares whole."""
    return [role.__name__ for role in ROLES if isinstance(store, role)]


# -- rules a store may reuse -----------------------------------------------------------------------


def in_arrival_order(open_commands: Sequence[tuple[str, str, bool]], *, limit: int) -> list[str]:
    """The ids a claim may lease, from ``(command_id, task_id, leased)`` of the open
    commands in arrival order: every one not leased, except those behind a leased (or
    skipped) command of the same task, at most ``limit``. A command whose ``leased`` is
    true is held by another claimer (its lease lives, or it is locked mid-claim)."""
    held: set[str] = set()
    picked: list[str] = []
    for command_id, task_id, leased in open_commands:
        if leased or task_id in held:
            held.add(task_id)
            continue
        if len(picked) == limit:
            held.add(task_id)  # the rest of this task waits for the next claim
            continue
        picked.append(command_id)
    return picked


_DEDUPE_SLACK = timedelta(milliseconds=5)


def dedupe_holder(rows: Iterable[Sequence[Any]], now: datetime) -> str | None:
    """The task holding a dedupe key, from its candidates (task id, status, ended at,
    dedupe window): an unfinished one, or a success less than its window before
    ``now`` (``create_deduped``)."""
    for task_id, status, ended_at, window in rows:
        if not TaskStatus(status).is_terminal:
            return str(task_id)
        ended = decode_dt(ended_at)
        if status != TaskStatus.SUCCEEDED.value or window is None or ended is None:
            continue
        # Kept after its success. A store may judge the window in SQL (SQLite's
        # julianday is good to about a millisecond): near its end, the success answers.
        if ended + timedelta(seconds=float(window)) + _DEDUPE_SLACK > now:
            return str(task_id)
    return None


def check_retention_args(
    before: datetime, statuses: frozenset[TaskStatus] | None, limit: int
) -> frozenset[TaskStatus]:
    """The finished statuses to prune (``statuses``, all of them by default); a
    ``ValueError`` for an unfinished one, a naive ``before`` or a ``limit`` below 1."""
    if before.tzinfo is None:
        raise ValueError(f"before must be an aware datetime, got {before.isoformat()}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    chosen = TERMINAL if statuses is None else frozenset(statuses)
    unfinished = sorted(s.value for s in chosen - TERMINAL)
    if unfinished:
        raise ValueError(f"only finished tasks are pruned, not {', '.join(unfinished)}")
    return chosen


def check_timeline_args(since: datetime, width: timedelta) -> int:
    """``width`` in whole microseconds; a ``ValueError`` for a naive ``since`` or a
    ``width`` under a microsecond."""
    if since.tzinfo is None:
        raise ValueError(f"since must be an aware datetime, got {since.isoformat()}")
    micros = width // timedelta(microseconds=1)
    if micros < 1:
        raise ValueError(f"width must be at least a microsecond, got {width}")
    return micros


def timeline_of(
    snapshots: Iterable[TaskSnapshot], since: datetime, width: timedelta
) -> dict[tuple[int, TaskStatus], int]:
    """``ended_timeline`` over snapshots in hand."""
    step = timedelta(microseconds=check_timeline_args(since, width))
    counts: dict[tuple[int, TaskStatus], int] = {}
    for s in snapshots:
        if s.status in TERMINAL and s.ended_at is not None and s.ended_at >= since:
            key = ((s.ended_at - since) // step, s.status)
            counts[key] = counts.get(key, 0) + 1
    return counts


def ended_mark(
    s: TaskSnapshot,
    to: TaskStatus,
    at: datetime,
    actor: str,
    reason: str,
    failure: Failure | None = None,
) -> Creation:
    """``s`` ended ``to`` at ``at`` (the one table checks the move), and its transition:
    written with a compare-and-set from ``s``'s version."""
    states.check(s.task_id, s.status, to)
    version = s.status_version + 1
    marked = s.evolve(status=to, status_version=version, ended_at=at, failure=failure)
    transition: Transition = trusted_transition(
        task_id=s.task_id,
        version=version,
        from_status=s.status,
        to_status=to,
        at=at,
        reason=reason,
        actor=actor,
    )
    return marked, transition


def lost_mark(s: TaskSnapshot, at: datetime, actor: str, verdict: Verdict) -> Creation:
    """The ``lost`` snapshot and transition reconcile writes for ``s``."""
    failure, reason = verdict(s.lease_owner)
    return ended_mark(s, TaskStatus.LOST, at, actor, reason, failure)


def mark_expired_by_scan(
    scan_tasks: Callable[[TaskScan], tuple[int, list[TaskSnapshot]]],
    mark_lost: Callable[[Sequence[Creation]], set[str]],
    scan: TaskScan,
    *,
    exclude: frozenset[str],
    at: datetime,
    actor: str,
    verdict: Verdict,
    chunk: int = 500,
) -> tuple[list[str], list[str]]:
    """``mark_expired_lost`` through a scan and ``mark_lost``: the expired (but those
    in ``exclude``) read, then marked ``chunk`` at a time, each its own compare-and-set.
    Returns the ids marked, and the ids let go (their version moved meanwhile: their
    holder is alive)."""
    _, expired = scan_tasks(scan)
    candidates = [s for s in expired if s.task_id not in exclude]
    lost: list[str] = []
    let_go: list[str] = []
    for offset in range(0, len(candidates), chunk):
        part = candidates[offset : offset + chunk]
        won = mark_lost([lost_mark(s, at, actor, verdict) for s in part])
        for snapshot in part:
            (lost if snapshot.task_id in won else let_go).append(snapshot.task_id)
    return lost, let_go


class ReadWhole:
    """``count_tasks``, ``scan_tasks`` and ``ended_timeline`` of ``Maintenance`` answered
    through the core (``query`` and ``history``; time and memory grow with the store):
    the memory store's own answers, and the node's for a store without the role."""

    __slots__ = ("store",)

    def __init__(self, store: TaskStore) -> None:
        self.store = store

    def count_tasks(
        self, by: str, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        counts: dict[Any, int] = {}
        for s in self.store.query(TaskQuery(statuses=statuses)):
            value = (s.bucket, s.status) if by == "bucket_status" else getattr(s, by)
            counts[value] = counts.get(value, 0) + 1
        return counts

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        store = self.store
        kept = [
            s
            for s in store.query(TaskQuery(statuses=scan.statuses, buckets=scan.buckets))
            if scan.matches(s)
        ]
        if scan.unchanged_since is not None:
            cut = scan.unchanged_since
            kept = [s for s in kept if s.created_at <= cut and self._changed_at(s) <= cut]
        return len(kept), kept if scan.limit is None else kept[: scan.limit]

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        return timeline_of(self.store.query(TaskQuery(statuses=TERMINAL)), since, width)

    def _changed_at(self, s: TaskSnapshot) -> datetime:
        """When the task last changed status: its trail's row for the current version."""
        trail = self.store.history(s.task_id, since_version=s.status_version - 1)
        return trail[-1].at if trail else s.created_at


# -- traits: each declared alone ------------------------------------------------------------------


@runtime_checkable
class SupportsAtomic(Protocol):
    def atomic(self) -> AbstractContextManager[None]:
        """A context manager: the store calls made inside it, on this thread, commit
        together or not at all (an exception inside undoes them all). The fallbacks of
        ``BatchedWrites`` use it."""
        ...


@runtime_checkable
class DeclaresValueRules(Protocol):
    """A store that says what text it can hold (``chongming_task.values``)."""

    value_rules: ValueRules


@runtime_checkable
class SupportsStorageClock(Protocol):
    def storage_now(self) -> datetime:
        """The store's own clock (``now()`` on PostgreSQL): one clock for every node's
        lease and liveness decisions, however far a node's own clock drifts."""
        ...


@runtime_checkable
class SupportsConnectionCount(Protocol):
    def connections(self) -> int:
        """Server connections the store holds now (a node says it in its health)."""
        ...


@runtime_checkable
class SupportsCreateSchema(Protocol):
    """A store whose schema is created apart from use (by a role with DDL rights)."""

    where: str
    """Where the store is, safe to print (no password)."""
    schema: str

    def create_schema(self) -> None:
        """Create the store's schema if absent (idempotent)."""
        ...


PREVIEW = 4000
"""Characters of a result's JSON text that a preview holds: a task's page shows them and
says the result goes on (the SQL stores write 4001, so a reader can tell)."""


@dataclass(frozen=True, slots=True)
class Previewed:
    """A task as one look at it needs it: ``snapshot`` with its result left out
    (``outcome`` ``None``) where the result's JSON text is longer than ``PREVIEW``
    characters, and ``preview``, then that text's first ``PREVIEW`` characters (else
    ``None``: the snapshot holds the whole result)."""

    snapshot: TaskSnapshot
    preview: str | None = None


@runtime_checkable
class SupportsResultPreview(Protocol):
    """A store that can show the start of a large result without reading it whole (the
    SQL stores write each result's first characters beside it)."""

    def get_previewed(self, task_id: str) -> Previewed | None:
        """``get``, reading no more of a long result than its preview; ``None`` for no
        such task. The snapshot is ``get``'s in every other field, its traceback
        included."""
        ...

    def result_json(self, task_id: str) -> str | None:
        """The task's result as the JSON text the store holds, never decoded (a
        download); ``None`` for no such task, and for a task without a result."""
        ...


def previewed(snapshot: TaskSnapshot) -> Previewed:
    """``snapshot`` as ``get_previewed`` gives it, for a store that holds the result
    decoded (the memory store, and the fallback over ``get``): its JSON text encoded
    only as far as the preview needs."""
    if snapshot.outcome is None:
        return Previewed(snapshot)
    shown: list[str] = []
    size = 0
    for chunk in _ENCODER.iterencode(snapshot.outcome):
        shown.append(chunk)
        size += len(chunk)
        if size > PREVIEW:
            return Previewed(snapshot.evolve(outcome=None), "".join(shown)[:PREVIEW])
    return Previewed(snapshot)


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def rules_of(store: object) -> ValueRules:
    """What ``store`` declares it can hold (``value_rules``), or ``STRICT``."""
    if isinstance(store, DeclaresValueRules) and isinstance(store.value_rules, ValueRules):
        return store.value_rules
    return STRICT


class PartialCreate(StoreError):
    """A store without transactions created the first ``created`` tasks of a batch, then
    failed (the cause is chained). Those tasks are stored; the rest are not."""

    def __init__(self, created: int, cause: BaseException) -> None:
        super().__init__(f"{created} task(s) created before the batch failed: {cause}")
        self.created = created


class PartialWrite(StoreError):
    """A store without transactions saved the snapshot, then failed to append (the cause
    is chained). The stored version is the snapshot's; the trail is behind, and appending
    the same transitions again is harmless (``append`` is idempotent)."""
