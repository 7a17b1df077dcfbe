"""``Capabilities``: the one adapter the runtime asks about a store. It resolves the
store's roles once (``chongming_task.stores.roles``) and falls back, role by role, to the
14 methods of ``TaskStore`` where the store does not declare a role whole, so the
runtime has one code path whatever the store.

The runtime never asks a store what it can do; it asks its ``Capabilities``. A
third-party store needs no role; a store that declares one proves it with that role's
section of ``StoreContract``. ``docs/stores.md`` gives each role's contract and fallback.
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
    Command,
    NodeRecord,
    PipelineRecord,
    Progress,
    ScheduleRecord,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from . import codec
from .protocol import TaskStore
from .roles import (
    BatchedWrites,
    CommandChannel,
    CountBy,
    Creation,
    DeclaresValueRules,
    FleetRegistry,
    LifeWrite,
    Maintenance,
    PartialCreate,
    PartialWrite,
    PendingWrites,
    Previewed,
    ReadWhole,
    SupportsAtomic,
    SupportsConnectionCount,
    SupportsCreateSchema,
    SupportsResultPreview,
    SupportsStorageClock,
    Verdict,
    ended_mark,
    lost_mark,
    mark_expired_by_scan,
    previewed,
    rules_of,
)

__all__ = [
    "BatchedWrites",
    "Capabilities",
    "CommandChannel",
    "Commands",
    "DeclaresGroupCommit",
    "DeclaresValueRules",
    "FleetRegistry",
    "Maintenance",
    "PartialCreate",
    "PartialWrite",
    "PendingWrites",
    "ReadWhole",
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

# The names of single capabilities, each the role that holds it: an ``isinstance`` check
# with one asks for the whole role, as the node does.
DeclaresGroupCommit = SupportsCreateMany = SupportsWriteTransitions = BatchedWrites
SupportsWriteTogether = SupportsWriteBehind = SupportsRenewLeases = BatchedWrites
SupportsWriteActivity = SupportsMarkLost = SupportsDedupe = BatchedWrites
SupportsCommandWakeups = SupportsAddressedWakeups = SupportsHolderClaim = CommandChannel
SupportsPendingCommands = SupportsCommandLog = SupportsTransitionWakeups = CommandChannel
SupportsHolds = CommandChannel
SupportsNodeRegistry = SupportsNodePulse = SupportsScheduleRegistry = FleetRegistry
SupportsPipelineRegistry = FleetRegistry
SupportsTaskScan = SupportsEndedTimeline = SupportsMarkExpired = Maintenance
SupportsPruneByAge = SupportsLateReports = Maintenance


class Capabilities:
    """A store's roles, resolved once, each with its fallback; the runtime calls the
    methods, which behave the same whether the store declares a role or not."""

    __slots__ = (
        "_atomic",
        "_channel",
        "_connections",
        "_fleet",
        "_previews",
        "_schema",
        "_storage_now",
        "_upkeep",
        "_writes",
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
        self._writes: BatchedWrites | None = store if isinstance(store, BatchedWrites) else None
        self._channel: CommandChannel | None = store if isinstance(store, CommandChannel) else None
        self._fleet: FleetRegistry | None = store if isinstance(store, FleetRegistry) else None
        self._upkeep: Maintenance | None = store if isinstance(store, Maintenance) else None
        writes = self._writes
        self.group_commit = writes is not None and writes.group_commit is True
        """Whether the store commits writes made side by side together."""
        self._atomic: Callable[[], AbstractContextManager[None]] | None = (
            store.atomic if isinstance(store, SupportsAtomic) else None
        )
        # Resolved to the store's own method where it has one: the write-through calls
        # this for every transition, so no adapter frame sits in between.
        self.compare_and_write: Callable[..., None] = (
            writes.write_transitions if writes is not None else self._compare_and_write
        )
        self.write_behind: Callable[[Sequence[LifeWrite]], PendingWrites] | None = (
            writes.write_transitions_behind if writes is not None and self.group_commit else None
        )
        """The store's ``write_transitions_behind`` where it commits side-by-side writes
        together (``None`` elsewhere): a node's workers queue their writes with it and go
        on (``BehindWriter``)."""
        self.commands = Commands(store, self._channel)
        """The command side: wake-ups, claims, pending and finished commands."""
        self._storage_now = store.storage_now if isinstance(store, SupportsStorageClock) else None
        self._schema: SupportsCreateSchema | None = (
            store if isinstance(store, SupportsCreateSchema) else None
        )
        self._connections = (
            store.connections if isinstance(store, SupportsConnectionCount) else None
        )
        self._previews: SupportsResultPreview | None = (
            store if isinstance(store, SupportsResultPreview) else None
        )

    def __repr__(self) -> str:
        found = [
            name
            for name, present in (
                ("batched writes", self._writes),
                ("command channel", self._channel),
                ("fleet registry", self._fleet),
                ("maintenance", self._upkeep),
                ("atomic", self._atomic),
                ("storage clock", self._storage_now),
                ("create_schema", self._schema),
                ("connection count", self._connections),
            )
            if present is not None
        ]
        return f"Capabilities({self.store!r}: {', '.join(found) or 'the core alone'})"

    def atomic(self) -> AbstractContextManager[None]:
        """The store's transaction, or a no-op context (each call then stands alone)."""
        return self._atomic() if self._atomic is not None else contextlib.nullcontext()

    def create_many(self, items: Sequence[Creation]) -> bool:
        """Store new tasks, all or nothing where the store can. Returns whether their
        creation transitions were appended too (``False``: the caller appends them,
        through the write-through, so a failed append is retried).

        Without transactions, tasks are created one by one; a failure after some were
        created raises ``PartialCreate`` naming how many."""
        if self._writes is not None:
            self._writes.create_many(items)
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
        if self._writes is not None:
            return set(self._writes.renew_leases(task_ids, owner=owner, until=until))
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
        if self._writes is not None:
            return set(self._writes.write_activity(items, owner=owner))
        store = self.store
        with self.atomic():
            for task_id, progress, heartbeat in items:
                store.touch(task_id, progress=progress, heartbeat_at=heartbeat)
        return None

    def mark_lost(self, marks: Sequence[Creation]) -> set[str]:
        """``reconcile()``'s writes: each task its own compare-and-set (in one
        transaction where the store can). Returns the ids marked."""
        if self._writes is not None:
            return self._writes.mark_lost(marks)
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
        if self._upkeep is not None:
            marked = self._upkeep.mark_expired_lost(
                scan, exclude=exclude, at=at, actor=actor, verdict=verdict
            )
            return marked, []
        return mark_expired_by_scan(
            self.scan_tasks,
            self.mark_lost,
            scan,
            exclude=exclude,
            at=at,
            actor=actor,
            verdict=verdict,
            chunk=chunk,
        )

    def subscribe_transitions(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Subscribe ``wake`` to transition wake-ups; ``None`` where the store has none
        (a follower's poll interval alone then bounds the latency)."""
        if self._channel is None:
            return None
        return self._channel.subscribe_transitions(wake)

    def create_schema(self) -> tuple[str, str] | None:
        """Create the schema where the store needs it done apart; then return where it
        is and the schema's name (``None``: the store makes its own, as SQLite does)."""
        if self._schema is None:
            return None
        self._schema.create_schema()
        return self._schema.where, self._schema.schema

    # -- the fleet registry ---------------------------------------------------------------------

    @property
    def has_fleet_registry(self) -> bool:
        """Whether the store keeps what nodes declare (``FleetRegistry``)."""
        return self._fleet is not None

    def declare_node(self, record: NodeRecord) -> None:
        """Declare the node (nothing where the store keeps no registry)."""
        if self._fleet is not None:
            self._fleet.declare_node(record)

    def connections(self) -> int | None:
        """Server connections the store holds now (``SupportsConnectionCount``)."""
        return self._connections() if self._connections is not None else None

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        """Refresh and the claimable commands' count, 0 where the store keeps no
        registry (the poller polls); ``None``: declare again."""
        if self._fleet is None:
            return 0
        return self._fleet.pulse_node(node, now=now, health=health)

    def retire_node(self, node: str, *, now: datetime) -> None:
        if self._fleet is not None:
            self._fleet.retire_node(node, now=now)

    def nodes(self) -> list[NodeRecord]:
        """Every declaration; empty where the store keeps no registry."""
        return self._fleet.nodes() if self._fleet is not None else []

    def declare_schedule(self, record: ScheduleRecord) -> None:
        """Record the schedule (nothing where the store keeps no registry)."""
        if self._fleet is not None:
            self._fleet.declare_schedule(record)

    def forget_schedule(self, node: str, name: str) -> None:
        if self._fleet is not None:
            self._fleet.forget_schedule(node, name)

    def schedules(self) -> list[ScheduleRecord]:
        """Every schedule record; empty where the store keeps no registry."""
        return self._fleet.schedules() if self._fleet is not None else []

    def record_pipeline(self, record: PipelineRecord) -> None:
        """Record the run's shape (nothing where the store keeps no registry)."""
        if self._fleet is not None:
            self._fleet.record_pipeline(record)

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        if self._fleet is None:
            return None
        return self._fleet.pipeline_record(pipeline_run_id)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        return [] if self._fleet is None else self._fleet.pipeline_records(limit=limit)

    # -- maintenance, dedupe keys -----------------------------------------------------------------

    @property
    def prune_by_age(self) -> Maintenance:
        """The store's ``Maintenance``; ``ConfigurationError`` where it declares none."""
        if self._upkeep is None:
            raise ConfigurationError(
                f"{self.store!r} cannot prune by age (it declares no Maintenance role): "
                "prune --keep N"
            )
        return self._upkeep

    @property
    def has_dedupe(self) -> bool:
        return self._writes is not None

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """The store's ``create_deduped``; ``ConfigurationError`` where the store
        enforces no dedupe key (a key nobody enforces would promise what is not kept)."""
        if self._writes is None:
            raise ConfigurationError(
                f"{self.store!r} does not enforce dedupe keys (it declares no BatchedWrites "
                "role): submit without dedupe_key, or use a store that does"
            )
        return self._writes.create_deduped(snapshot, created)

    def record_late_report(self, report: LateReport) -> bool:
        """Keep ``report`` beside its task; ``False`` where the store keeps none (the
        node's log line is then the only record)."""
        if self._upkeep is None:
            return False
        self._upkeep.record_late_report(report)
        return True

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        """The reports of ``task_ids`` (``None``: every task's), newest first; empty
        where the store keeps none."""
        if self._upkeep is None:
            return []
        return self._upkeep.late_reports(task_ids=task_ids, limit=limit)

    def count_late_reports(self) -> int:
        return 0 if self._upkeep is None else self._upkeep.count_late_reports()

    # -- holds of a pause before the start ----------------------------------------------------

    @property
    def has_holds(self) -> bool:
        return self._channel is not None

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        """Keep the hold where the store can (``CommandChannel``); nothing elsewhere."""
        if self._channel is not None:
            self._channel.hold_task(task_id, since=since, by=by)

    def release_hold(self, task_id: str) -> None:
        if self._channel is not None:
            self._channel.release_hold(task_id)

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        """The held tasks of ``task_ids`` (``None``: any) and since when; empty where the
        store keeps none."""
        if self._channel is None:
            return {}
        return self._channel.holds(task_ids=task_ids, limit=limit)

    def get_previewed(self, task_id: str) -> Previewed | None:
        """A task with a long result cut to its preview: read so where the store can,
        else ``get`` (the whole result read) and cut here."""
        if self._previews is not None:
            return self._previews.get_previewed(task_id)
        found = self.store.get(task_id)
        return None if found is None else previewed(found)

    def result_json(self, task_id: str) -> str | None:
        """A task's result as JSON text: as the store holds it where it can say, else
        ``get``'s, encoded here."""
        if self._previews is not None:
            return self._previews.result_json(task_id)
        found = self.store.get(task_id)
        return None if found is None else codec.encode_json(found.outcome)

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
        return (self._upkeep or ReadWhole(self.store)).count_tasks(by, statuses=statuses)

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        """How many tasks ``scan`` keeps, and the oldest ``scan.limit`` of them."""
        return (self._upkeep or ReadWhole(self.store)).scan_tasks(scan)

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """Finished tasks per ``(slot, status)`` by when they ended."""
        timeline = self._upkeep or ReadWhole(self.store)
        return timeline.ended_timeline(since=since, width=width)


class Commands:
    """The command side of ``Capabilities`` (its ``commands``): the store's
    ``CommandChannel`` where it declares one, else the core's claim and no wake-ups."""

    __slots__ = ("_channel", "_store")

    def __init__(self, store: TaskStore, channel: CommandChannel | None) -> None:
        self._store = store
        self._channel = channel

    def subscribe(
        self, wake: Callable[[], None], *, holder: str | None = None
    ) -> Callable[[], None] | None:
        """Subscribe ``wake`` to command wake-ups: for ``holder``'s commands where one is
        given, else for all. ``None`` where the store has none (the poller's interval
        alone then bounds the latency)."""
        if self._channel is None:
            return None
        if holder is not None:
            return self._channel.subscribe_commands_for(holder, wake)
        return self._channel.subscribe_commands(wake)

    def claim(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """The open commands ``holder`` may act on where the store can tell, else all."""
        if self._channel is not None:
            return self._channel.claim_commands_for(
                holder, now=now, lease_seconds=lease_seconds, limit=limit
            )
        return self._store.claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)

    def pending(self, task_id: str) -> list[Command] | None:
        """The task's unfinished commands in arrival order; ``None`` where the store
        cannot tell (then any control may be behind one: send it as a command)."""
        return None if self._channel is None else self._channel.pending_commands(task_id)

    @property
    def has_log(self) -> bool:
        """Whether the store keeps finished commands."""
        return self._channel is not None

    @property
    def wakes(self) -> bool:
        """Whether a command written wakes the node it is for (the store's own
        ``CommandChannel``), rather than waiting for that node's next poll."""
        return self._channel is not None

    def finished(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """Commands finished after ``after``; empty where the store keeps no log."""
        if self._channel is None:
            return []
        return self._channel.finished_commands(after=after, limit=limit)
