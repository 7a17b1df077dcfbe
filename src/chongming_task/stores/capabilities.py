"""Optional store capabilities: what a store *may* offer beyond the 14 methods of
``TaskStore``, declared as protocols, and ``Capabilities``, the one adapter that resolves
them once per store and falls back to the 14 methods where a store lacks one. (The
protocols are written in ``_supports`` and exported from here.)

The runtime never asks a store what it can do; it asks its ``Capabilities``, so it has one
code path whatever the store. A third-party store needs none of these; a store that
declares one proves it with the capability section of ``StoreContract``, which runs only
for the capabilities the store declares. ``docs/stores.md`` §10 gives each contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import ConcurrencyConflict, ConfigurationError, StoreError
from ..health import NodeHealth
from ..late import LateReport
from ..model import (
    NodeRecord,
    PipelineRecord,
    Progress,
    ScheduleRecord,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ._channel import CommandChannel
from ._lost import ended_mark, lost_mark
from ._read_whole import ReadWhole
from ._supports import (
    CountBy,
    Creation,
    DeclaresGroupCommit,
    DeclaresValueRules,
    LifeWrite,
    PartialCreate,
    PartialWrite,
    PendingWrites,
    SupportsAddressedWakeups,
    SupportsAtomic,
    SupportsCommandLog,
    SupportsCommandWakeups,
    SupportsConnectionCount,
    SupportsCreateMany,
    SupportsCreateSchema,
    SupportsDedupe,
    SupportsEndedTimeline,
    SupportsHolderClaim,
    SupportsHolds,
    SupportsLateReports,
    SupportsMarkExpired,
    SupportsMarkLost,
    SupportsNodePulse,
    SupportsNodeRegistry,
    SupportsPendingCommands,
    SupportsPipelineRegistry,
    SupportsPruneByAge,
    SupportsRenewLeases,
    SupportsScheduleRegistry,
    SupportsStorageClock,
    SupportsTaskScan,
    SupportsTransitionWakeups,
    SupportsWriteActivity,
    SupportsWriteBehind,
    SupportsWriteTogether,
    SupportsWriteTransitions,
    Verdict,
    rules_of,
)
from .protocol import TaskStore

__all__ = [
    "Capabilities",
    "DeclaresGroupCommit",
    "DeclaresValueRules",
    "PartialCreate",
    "PartialWrite",
    "PendingWrites",
    "SupportsAddressedWakeups",
    "SupportsAtomic",
    "SupportsCommandLog",
    "SupportsCommandWakeups",
    "SupportsConnectionCount",
    "SupportsCreateMany",
    "SupportsCreateSchema",
    "SupportsDedupe",
    "SupportsEndedTimeline",
    "SupportsHolderClaim",
    "SupportsHolds",
    "SupportsLateReports",
    "SupportsMarkExpired",
    "SupportsMarkLost",
    "SupportsNodePulse",
    "SupportsNodeRegistry",
    "SupportsPendingCommands",
    "SupportsPipelineRegistry",
    "SupportsPruneByAge",
    "SupportsRenewLeases",
    "SupportsScheduleRegistry",
    "SupportsStorageClock",
    "SupportsTaskScan",
    "SupportsTransitionWakeups",
    "SupportsWriteActivity",
    "SupportsWriteBehind",
    "SupportsWriteTogether",
    "SupportsWriteTransitions",
    "Verdict",
    "ended_mark",
    "lost_mark",
    "rules_of",
]


class Capabilities:
    """A store's optional capabilities, resolved once, each with its fallback; the
    runtime calls the methods, which behave the same whether the store has one or not."""

    __slots__ = (
        "_atomic",
        "_connections",
        "_create_many",
        "_dedupe",
        "_holds",
        "_late",
        "_mark_expired",
        "_mark_lost",
        "_nodes",
        "_pipelines",
        "_pulse",
        "_renew_leases",
        "_retention",
        "_scan",
        "_schedules",
        "_schema",
        "_storage_now",
        "_subscribe_transitions",
        "_timeline",
        "_write_activity",
        "_write_together",
        "_write_transitions",
        "commands",
        "compare_and_write",
        "group_commit",
        "store",
        "value_rules",
        "write_behind",
    )

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.value_rules = rules_of(store)
        self.group_commit = isinstance(store, DeclaresGroupCommit) and store.group_commit is True
        """Whether the store commits writes made side by side together."""
        self._atomic: Callable[[], AbstractContextManager[None]] | None = (
            store.atomic if isinstance(store, SupportsAtomic) else None
        )
        self._create_many = store.create_many if isinstance(store, SupportsCreateMany) else None
        self._write_transitions = (
            store.write_transitions if isinstance(store, SupportsWriteTransitions) else None
        )
        # Resolved to the store's own method where it has one: the write-through calls
        # this for every transition, so no adapter frame sits in between.
        self.compare_and_write: Callable[..., None] = (
            self._write_transitions or self._compare_and_write
        )
        self._write_together = (
            store.write_transitions_together if isinstance(store, SupportsWriteTogether) else None
        )
        self.write_behind: Callable[[Sequence[LifeWrite]], PendingWrites] | None = (
            store.write_transitions_behind if isinstance(store, SupportsWriteBehind) else None
        )
        """The store's ``write_transitions_behind`` (``None`` without one): a node's
        workers queue their writes with it and go on (``BehindWriter``)."""
        self._mark_lost = store.mark_lost if isinstance(store, SupportsMarkLost) else None
        self._renew_leases = store.renew_leases if isinstance(store, SupportsRenewLeases) else None
        self._write_activity = (
            store.write_activity if isinstance(store, SupportsWriteActivity) else None
        )
        self._mark_expired = (
            store.mark_expired_lost if isinstance(store, SupportsMarkExpired) else None
        )
        self.commands = CommandChannel(store)
        """The command side: wake-ups, claims, pending and finished commands."""
        self._subscribe_transitions = (
            store.subscribe_transitions if isinstance(store, SupportsTransitionWakeups) else None
        )
        self._nodes: SupportsNodeRegistry | None = (
            store if isinstance(store, SupportsNodeRegistry) else None
        )
        self._schedules: SupportsScheduleRegistry | None = (
            store if isinstance(store, SupportsScheduleRegistry) else None
        )
        self._pipelines: SupportsPipelineRegistry | None = (
            store if isinstance(store, SupportsPipelineRegistry) else None
        )
        self._dedupe = store.create_deduped if isinstance(store, SupportsDedupe) else None
        self._late: SupportsLateReports | None = (
            store if isinstance(store, SupportsLateReports) else None
        )
        self._holds: SupportsHolds | None = store if isinstance(store, SupportsHolds) else None
        self._storage_now = store.storage_now if isinstance(store, SupportsStorageClock) else None
        self._scan: SupportsTaskScan | None = store if isinstance(store, SupportsTaskScan) else None
        self._schema: SupportsCreateSchema | None = (
            store if isinstance(store, SupportsCreateSchema) else None
        )
        self._retention = store if isinstance(store, SupportsPruneByAge) else None
        self._timeline = store if isinstance(store, SupportsEndedTimeline) else None
        self._pulse = store.pulse_node if isinstance(store, SupportsNodePulse) else None
        self._connections = (
            store.connections if isinstance(store, SupportsConnectionCount) else None
        )

    def __repr__(self) -> str:
        found = [
            name
            for name, present in (
                ("atomic", self._atomic),
                ("create_many", self._create_many),
                ("write_transitions", self._write_transitions),
                ("mark_lost", self._mark_lost),
                ("renew_leases", self._renew_leases),
                ("write_activity", self._write_activity),
                ("mark_expired_lost", self._mark_expired),
                ("create_deduped", self._dedupe),
                ("subscribe_transitions", self._subscribe_transitions),
                ("node registry", self._nodes),
                ("schedule registry", self._schedules),
                ("pipeline registry", self._pipelines),
                ("late reports", self._late),
                ("holds", self._holds),
                ("storage clock", self._storage_now),
                ("task scan", self._scan),
                ("create_schema", self._schema),
                ("prune by age", self._retention),
                ("ended timeline", self._timeline),
                ("node pulse", self._pulse),
            )
            if present is not None
        ] + self.commands.found()
        return f"Capabilities({self.store!r}: {', '.join(found) or 'none'})"

    def atomic(self) -> AbstractContextManager[None]:
        """The store's transaction, or a no-op context (each call then stands alone)."""
        return self._atomic() if self._atomic is not None else contextlib.nullcontext()

    def create_many(self, items: Sequence[Creation]) -> bool:
        """Store new tasks, all or nothing where the store can. Returns whether their
        creation transitions were appended too (``False``: the caller appends them,
        through the write-through, so a failed append is retried).

        Without transactions, tasks are created one by one; a failure after some were
        created raises ``PartialCreate`` naming how many."""
        if self._create_many is not None:
            self._create_many(items)
            return True
        store = self.store
        if self._atomic is not None:
            with self._atomic():
                for snapshot, created in items:
                    store.create(snapshot)
                    store.append(created)
            return True
        done = 0
        try:
            for snapshot, _ in items:
                store.create(snapshot)
                done += 1
        except Exception as exc:
            if done == 0:
                raise
            raise PartialCreate(done, exc) from exc
        return False

    def write_transitions(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int | None,
        transitions: Sequence[Transition],
    ) -> None:
        """Bring the stored task to ``snapshot`` (compare-and-set against
        ``expect_version``; ``None``: the row is current, only append) and append
        ``transitions``: one transaction where the store can. Without transactions a
        failed append after the save raises ``PartialWrite``.

        ``compare_and_write(snapshot, expect_version=..., transitions=...)`` is the same
        with a version always given: the store's own ``write_transitions`` where it has
        one."""
        if expect_version is None:
            for item in transitions:
                self.store.append(item)
            return
        self.compare_and_write(snapshot, expect_version=expect_version, transitions=transitions)

    def compare_and_write_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """``compare_and_write`` for several tasks at once: one statement where the store
        commits side-by-side writes together, else one call each. Returns each write's
        error (``None``: written), in order; one write's failure never fails another."""
        if self._write_together is not None:
            return self._write_together(writes)
        errors: list[BaseException | None] = []
        for snapshot, expect_version, transitions in writes:
            try:
                self.compare_and_write(
                    snapshot, expect_version=expect_version, transitions=transitions
                )
            except Exception as exc:
                errors.append(exc)
            else:
                errors.append(None)
        return errors

    def _compare_and_write(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        """``compare_and_write`` for a store without ``write_transitions``."""
        store = self.store
        if self._atomic is not None:
            with self._atomic():
                store.save(snapshot, expect_version=expect_version)
                for item in transitions:
                    store.append(item)
            return
        store.save(snapshot, expect_version=expect_version)
        try:
            for item in transitions:
                store.append(item)
        except Exception as exc:
            raise PartialWrite(f"saved task {snapshot.task_id}, trail behind: {exc}") from exc

    def renew_leases(
        self, task_ids: Sequence[str], *, owner: str, until: datetime
    ) -> set[str] | None:
        """The supervisor's lease renewal: the ids renewed (a task finished or held by
        another owner is not), in one transaction where the store can. ``None`` where
        the store cannot tell (a ``touch`` per task: never on a finished row)."""
        if self._renew_leases is not None:
            return set(self._renew_leases(task_ids, owner=owner, until=until))
        store = self.store
        with self.atomic():
            for task_id in task_ids:
                store.touch(task_id, lease_owner=owner, lease_until=until)
        return None

    def write_activity(
        self, items: Sequence[tuple[str, Progress | None, datetime | None]], *, owner: str
    ) -> set[str] | None:
        """Progress and heartbeats of many tasks: the ids written (a task finished or
        held by another owner is not), in one transaction where the store can. ``None``
        where the store cannot tell (a ``touch`` per task: never on a finished row)."""
        if self._write_activity is not None:
            return set(self._write_activity(items, owner=owner))
        store = self.store
        with self.atomic():
            for task_id, progress, heartbeat in items:
                store.touch(task_id, progress=progress, heartbeat_at=heartbeat)
        return None

    def mark_lost(self, marks: Sequence[Creation]) -> set[str]:
        """``reconcile()``'s writes: each task its own compare-and-set (in one
        transaction where the store can). Returns the ids marked."""
        if self._mark_lost is not None:
            return self._mark_lost(marks)
        won: set[str] = set()
        store = self.store
        with self.atomic():
            for marked, transition in marks:
                try:
                    store.save(marked, expect_version=transition.version - 1)
                except ConcurrencyConflict:
                    continue  # it moved: its supervisor is alive after all
                store.append(transition)
                won.add(marked.task_id)
        return won

    def mark_expired_lost(
        self,
        scan: TaskScan,
        *,
        exclude: frozenset[str],
        at: datetime,
        actor: str,
        verdict: Verdict,
        chunk: int = 500,
    ) -> tuple[list[str], list[str]]:
        """``reconcile()``'s writes: the ids marked ``lost``, and the ids let go (their
        version moved under us: their supervisor is alive). In one statement where the
        store can; else the expired are read, then marked ``chunk`` at a time, each its
        own compare-and-set (``mark_lost``)."""
        if self._mark_expired is not None:
            marked = self._mark_expired(scan, exclude=exclude, at=at, actor=actor, verdict=verdict)
            return marked, []
        _, expired = self.scan_tasks(scan)
        candidates = [s for s in expired if s.task_id not in exclude]
        lost: list[str] = []
        let_go: list[str] = []
        for offset in range(0, len(candidates), chunk):
            part = candidates[offset : offset + chunk]
            won = self.mark_lost([lost_mark(s, at, actor, verdict) for s in part])
            for snapshot in part:
                (lost if snapshot.task_id in won else let_go).append(snapshot.task_id)
        return lost, let_go

    def subscribe_transitions(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Subscribe ``wake`` to transition wake-ups; ``None`` where the store has none
        (a follower's poll interval alone then bounds the latency)."""
        if self._subscribe_transitions is None:
            return None
        return self._subscribe_transitions(wake)

    def create_schema(self) -> tuple[str, str] | None:
        """Create the schema where the store needs it done apart; then return where it
        is and the schema's name (``None``: the store makes its own, as SQLite does)."""
        if self._schema is None:
            return None
        self._schema.create_schema()
        return self._schema.where, self._schema.schema

    # -- fleet visibility ----------------------------------------------------------------------

    @property
    def has_node_registry(self) -> bool:
        return self._nodes is not None

    def declare_node(self, record: NodeRecord) -> None:
        """Declare the node (nothing where the store keeps no registry)."""
        if self._nodes is not None:
            self._nodes.declare_node(record)

    @property
    def has_node_pulse(self) -> bool:
        return self._pulse is not None

    def connections(self) -> int | None:
        """Server connections the store holds now (``SupportsConnectionCount``)."""
        return self._connections() if self._connections is not None else None

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        """Refresh and the claimable commands' count (``SupportsNodePulse``), else
        ``refresh_node`` and 0 (the poller polls); ``None``: declare again."""
        if self._pulse is not None:
            return self._pulse(node, now=now, health=health)
        if self._nodes is None:
            return 0
        return 0 if self._nodes.refresh_node(node, now=now, health=health) else None

    def retire_node(self, node: str, *, now: datetime) -> None:
        if self._nodes is not None:
            self._nodes.retire_node(node, now=now)

    def nodes(self) -> list[NodeRecord]:
        """Every declaration; empty where the store keeps no registry."""
        return self._nodes.nodes() if self._nodes is not None else []

    @property
    def has_schedule_registry(self) -> bool:
        return self._schedules is not None

    def declare_schedule(self, record: ScheduleRecord) -> None:
        """Record the schedule (nothing where the store keeps no registry)."""
        if self._schedules is not None:
            self._schedules.declare_schedule(record)

    def forget_schedule(self, node: str, name: str) -> None:
        if self._schedules is not None:
            self._schedules.forget_schedule(node, name)

    def schedules(self) -> list[ScheduleRecord]:
        """Every schedule record; empty where the store keeps no registry."""
        return self._schedules.schedules() if self._schedules is not None else []

    @property
    def has_pipeline_registry(self) -> bool:
        return self._pipelines is not None

    def record_pipeline(self, record: PipelineRecord) -> None:
        """Record the run's shape (nothing where the store keeps no registry)."""
        if self._pipelines is not None:
            self._pipelines.record_pipeline(record)

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        if self._pipelines is None:
            return None
        return self._pipelines.pipeline_record(pipeline_run_id)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        return [] if self._pipelines is None else self._pipelines.pipeline_records(limit=limit)

    @property
    def prune_by_age(self) -> SupportsPruneByAge:
        """``SupportsPruneByAge``; ``ConfigurationError`` where the store has none."""
        if self._retention is None:
            raise ConfigurationError(
                f"{self.store!r} cannot prune by age (SupportsPruneByAge): prune --keep N"
            )
        return self._retention

    @property
    def has_dedupe(self) -> bool:
        return self._dedupe is not None

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """``SupportsDedupe.create_deduped``; ``ConfigurationError`` where the store
        enforces no dedupe key (a key nobody enforces would promise what is not kept)."""
        if self._dedupe is None:
            raise ConfigurationError(
                f"{self.store!r} does not enforce dedupe keys (SupportsDedupe): submit "
                "without dedupe_key, or use a store that does"
            )
        return self._dedupe(snapshot, created)

    def record_late_report(self, report: LateReport) -> bool:
        """Keep ``report`` beside its task; ``False`` where the store keeps none (the
        node's log line is then the only record)."""
        if self._late is None:
            return False
        self._late.record_late_report(report)
        return True

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        """The reports of ``task_ids`` (``None``: every task's), newest first; empty
        where the store keeps none."""
        if self._late is None:
            return []
        return self._late.late_reports(task_ids=task_ids, limit=limit)

    def count_late_reports(self) -> int:
        return 0 if self._late is None else self._late.count_late_reports()

    # -- holds of a pause before the start ----------------------------------------------------

    @property
    def has_holds(self) -> bool:
        return self._holds is not None

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        """Keep the hold where the store can (``SupportsHolds``); nothing elsewhere."""
        if self._holds is not None:
            self._holds.hold_task(task_id, since=since, by=by)

    def release_hold(self, task_id: str) -> None:
        if self._holds is not None:
            self._holds.release_hold(task_id)

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        """The held tasks of ``task_ids`` (``None``: any) and since when; empty where the
        store keeps none."""
        if self._holds is None:
            return {}
        return self._holds.holds(task_ids=task_ids, limit=limit)

    @property
    def has_storage_clock(self) -> bool:
        return self._storage_now is not None

    def storage_now(self) -> datetime:
        """The store's clock; ``StoreError`` where it has none (ask ``has_storage_clock``)."""
        if self._storage_now is None:
            raise StoreError(f"{self.store!r} has no clock of its own")
        return self._storage_now()

    def now(self) -> datetime:
        """The store's clock where it has one, else this machine's (UTC)."""
        return self._storage_now() if self._storage_now is not None else datetime.now(UTC)

    # -- questions about many tasks ------------------------------------------------------------

    def count_tasks(
        self, by: CountBy, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        """Tasks per value of ``by``: a ``GROUP BY`` where the store can."""
        return (self._scan or ReadWhole(self.store)).count_tasks(by, statuses=statuses)

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        """How many tasks ``scan`` keeps, and the oldest ``scan.limit`` of them."""
        return (self._scan or ReadWhole(self.store)).scan_tasks(scan)

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """Finished tasks per ``(slot, status)`` by when they ended (``SupportsEndedTimeline``)."""
        timeline = self._timeline or ReadWhole(self.store)
        return timeline.ended_timeline(since=since, width=width)
