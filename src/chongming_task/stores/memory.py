"""``InMemoryTaskStore``: the contract in plain dictionaries, for tests and one-shot runs.

It holds record objects and never serializes them, so it cannot catch serialization
mistakes; "works on the memory store" does not mean "works on a real store".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ..errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ..health import NodeHealth
from ..late import LateReport
from ..model import (
    Command,
    NodeRecord,
    PipelineRecord,
    Progress,
    ScheduleRecord,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
    utc,
)
from ..states import LOSABLE, TERMINAL
from ..trail import TRAIL_TEXT, TRAIL_WIDTH, Trail, trail_merged, trail_transitions
from ..values import ValueRules
from . import codec
from .roles import (
    CountBy,
    Creation,
    LifeWrite,
    Previewed,
    ReadWhole,
    Settled,
    Verdict,
    check_retention_args,
    dedupe_holder,
    in_arrival_order,
    mark_expired_by_scan,
    previewed,
    timeline_of,
)

__all__ = ["InMemoryTaskStore"]

_STRIPES = 64


def _closed() -> StoreError:
    return StoreError("InMemoryTaskStore is closed")


class InMemoryTaskStore:
    """A thread-safe ``TaskStore`` living in this process only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # commands and prune
        # A task's compare-and-set (save) and its touch take one of these, picked by task
        # id: workers saving different tasks almost never meet on a lock. One shared lock
        # here made the worker threads queue behind whichever held it across a GIL switch
        # (throughput fell by half with 4 workers, bench/throughput.py).
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))
        self._tasks: dict[str, TaskSnapshot] = {}
        # Each task's trail as a ``Trail``: the store holds every task it was given, and a
        # trail is then nothing the garbage collector walks. Written under the task's
        # stripe (``_add``), but where a new task's first transition makes it
        # (``create_many``: a ``setdefault``, atomic on its own).
        self._history: dict[str, Trail] = {}
        self._commands: dict[str, Command] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._schedules: dict[tuple[str, str], ScheduleRecord] = {}
        self._pipelines: dict[str, PipelineRecord] = {}
        self._holds: dict[str, datetime] = {}
        self._late: dict[str, LateReport] = {}
        self._keyed: dict[str, str] = {}  # a dedupe key: the last task created with it
        self._dedupe_lock = threading.Lock()
        self._closed = False

    value_rules = ValueRules(nul_in_text=True)
    """Objects are kept as they are; NUL is fine (see ``chongming_task.values``)."""

    group_commit = False
    """Each write is a dictionary operation under a lock: nothing to share."""

    def __repr__(self) -> str:
        return f"InMemoryTaskStore(tasks={len(self._tasks)})"

    def _stripe(self, task_id: str) -> threading.Lock:
        return self._stripes[hash(task_id) % _STRIPES]

    def _check_open(self) -> None:
        if self._closed:
            raise _closed()

    def create(self, snapshot: TaskSnapshot) -> None:
        # One dict operation, atomic on its own: creating takes no lock, so a submitting
        # thread never queues behind a worker's save (the runtime's hot path).
        self._check_open()
        if self._tasks.setdefault(snapshot.task_id, snapshot) is not snapshot:
            raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """``BatchedWrites``: the last task created with the key
        is the only one that can hold it (a task is created with it only when none
        does)."""
        key = snapshot.dedupe_key
        if key is None:
            raise ValueError(f"task {snapshot.task_id} has no dedupe_key")
        with self._dedupe_lock:
            last = self._tasks.get(self._keyed.get(key, ""))
            if last is not None:
                found = dedupe_holder(
                    [(last.task_id, last.status.value, last.ended_at, last.dedupe_window)],
                    snapshot.created_at,
                )
                if found is not None:
                    return found
            self.create_many([(snapshot, created)])
            self._keyed[key] = snapshot.task_id
        return None

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """``BatchedWrites``: ``create`` each snapshot and
        ``append`` its transition; an existing id raises ``TaskAlreadyExists`` and takes
        back the tasks this call created."""
        if self._closed:  # inline on the hot paths: one attribute read, no call
            raise _closed()
        tasks = self._tasks
        for i, (snapshot, _) in enumerate(items):
            if tasks.setdefault(snapshot.task_id, snapshot) is not snapshot:
                for made, _ in items[:i]:
                    tasks.pop(made.task_id, None)
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
        history, text = self._history, TRAIL_TEXT
        for _, t in items:  # a new task's trail is new: one setdefault makes it
            first = (t.version, text[t.from_status], text[t.to_status], t.at, t.reason, t.actor)
            if history.setdefault(t.task_id, first) is not first:
                self.append(t)  # appended before its create: merged, under its stripe

    def write_transitions(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        """``BatchedWrites``: ``save``, then ``append``
        each transition; a conflict raises with nothing written. The runtime's hot path:
        one check, one lock and one trail lookup for the whole write."""
        if self._closed:  # inline on the hot paths: one attribute read, no call
            raise _closed()
        task_id = snapshot.task_id
        tasks = self._tasks
        with self._stripes[hash(task_id) % _STRIPES]:  # compare and set, then the trail
            current = tasks.get(task_id)
            if current is None or current.status_version != expect_version:
                raise ConcurrencyConflict.version_mismatch(
                    task_id, expect_version, None if current is None else current.status_version
                )
            # The lease belongs to touch(): carry the stored one over, never the caller's.
            if (
                snapshot.lease_until == current.lease_until
                and snapshot.lease_owner == current.lease_owner
            ):
                tasks[task_id] = snapshot
            else:
                tasks[task_id] = snapshot.evolve(
                    lease_owner=current.lease_owner, lease_until=current.lease_until
                )
            if transitions:
                # _add(), inline for the common case: the task's own transitions, each
                # past the last its trail holds.
                history, text = self._history, TRAIL_TEXT
                trail = history.get(task_id)
                if trail is not None:
                    last = trail[len(trail) - TRAIL_WIDTH]
                    for t in transitions:
                        if t.task_id != task_id or t.version <= last:
                            break
                        trail += (
                            t.version,
                            text[t.from_status],
                            text[t.to_status],
                            t.at,
                            t.reason,
                            t.actor,
                        )
                        last = t.version
                    else:
                        history[task_id] = trail
                        return
                own = [t for t in transitions if t.task_id == task_id]
                if own:
                    self._add(task_id, own)
        for transition in transitions:
            if transition.task_id != task_id:
                self.append(transition)

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        """``BatchedWrites``: one ``write_transitions`` each, every error caught."""
        errors: list[BaseException | None] = []
        for snapshot, expect_version, transitions in writes:
            try:
                self.write_transitions(
                    snapshot, expect_version=expect_version, transitions=transitions
                )
            except Exception as exc:
                errors.append(exc)
            else:
                errors.append(None)
        return errors

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Settled:
        """``BatchedWrites``: written at once (a dictionary has no commit to share)."""
        return Settled(self.write_transitions_together(writes))

    def mark_lost(self, marks: Sequence[Creation]) -> set[str]:
        """``BatchedWrites``: each mark a compare-and-set of the ending's columns."""
        self._check_open()
        won: set[str] = set()
        for marked, transition in marks:
            task_id = marked.task_id
            with self._stripe(task_id):
                current = self._tasks.get(task_id)
                if current is None or current.status_version != transition.version - 1:
                    continue  # it moved: its holder is alive after all
                self._tasks[task_id] = current.evolve(
                    status=marked.status,
                    status_version=marked.status_version,
                    ended_at=marked.ended_at,
                    failure=marked.failure,
                )
            self.append(transition)
            won.add(task_id)
        return won

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        self.write_transitions(snapshot, expect_version=expect_version, transitions=())

    def get(self, task_id: str) -> TaskSnapshot | None:
        if self._closed:  # inline on the hot paths: one attribute read, no call
            raise _closed()
        return self._tasks.get(task_id)

    def get_previewed(self, task_id: str) -> Previewed | None:
        """``SupportsResultPreview``: the result is held decoded here, so its JSON text
        is encoded only as far as the preview needs (``roles.previewed``)."""
        found = self.get(task_id)
        return None if found is None else previewed(found)

    def result_json(self, task_id: str) -> str | None:
        found = self.get(task_id)
        return None if found is None else codec.encode_json(found.outcome)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = query or TaskQuery()
        self._check_open()
        # list() copies in one step; filtering a live view could see it change size.
        found = [s for s in list(self._tasks.values()) if query.matches(s)]
        return query.ordered(found)  # brief or not: a result here costs nothing to keep

    def counts(self) -> dict[TaskStatus, int]:
        self._check_open()
        out: dict[TaskStatus, int] = {}
        for snapshot in list(self._tasks.values()):
            out[snapshot.status] = out.get(snapshot.status, 0) + 1
        return out

    def append(self, transition: Transition) -> None:
        self._check_open()
        task_id = transition.task_id
        with self._stripes[hash(task_id) % _STRIPES]:
            self._add(task_id, (transition,))

    def _add(self, task_id: str, transitions: Sequence[Transition]) -> None:
        """Add ``transitions`` (of ``task_id``) to its trail; the versions it holds stay
        as they are. Caller holds the task's stripe; a create adds its task's first
        transition without it, but only where there is no trail (``setdefault``)."""
        history = self._history
        trail = history.get(task_id)
        if trail is None:
            made = trail_merged((), transitions)
            trail = history.setdefault(task_id, made)
            if trail is made:
                return
        history[task_id] = trail_merged(trail, transitions)

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        self._check_open()
        return trail_transitions(task_id, self._history.get(task_id, ()), since_version)

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        self._check_open()
        with self._stripe(task_id):
            current = self._tasks.get(task_id)
            if current is None or current.status in TERMINAL:
                return
            self._tasks[task_id] = _touched(
                current, progress, heartbeat_at, lease_owner, lease_until
            )

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> list[str]:
        """``BatchedWrites``."""
        return self._activity([(t, None, None) for t in task_ids], owner, until)

    def write_activity(
        self, items: Sequence[tuple[str, Progress | None, datetime | None]], *, owner: str
    ) -> list[str]:
        """``BatchedWrites``."""
        return self._activity(items, owner, None)

    def _activity(
        self,
        items: Sequence[tuple[str, Progress | None, datetime | None]],
        owner: str,
        until: datetime | None,
    ) -> list[str]:
        """Touch the tasks that are unfinished and not held by another owner."""
        self._check_open()
        written: list[str] = []
        for task_id, progress, heartbeat in items:
            with self._stripe(task_id):
                current = self._tasks.get(task_id)
                if current is None or current.status in TERMINAL:
                    continue
                if current.lease_owner not in (None, owner):
                    continue
                self._tasks[task_id] = _touched(
                    current, progress, heartbeat, None if until is None else owner, until
                )
            written.append(task_id)
        return written

    def submit_command(self, command: Command) -> None:
        with self._lock:
            self._check_open()
            if command.command_id in self._commands:
                raise StoreError(f"command {command.command_id} already exists")
            self._commands[command.command_id] = command

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        return self._claim(None, now=now, lease_seconds=lease_seconds, limit=limit)

    def _claim(
        self, holder: str | None, *, now: datetime, lease_seconds: float, limit: int
    ) -> list[Command]:
        now = utc(now, "now")
        until = now + timedelta(seconds=lease_seconds)
        with self._lock:
            self._check_open()
            open_ = [
                c
                for c in self._commands.values()
                if c.finished_at is None and self._claimable_by(holder, c.task_id)
            ]
            picked = in_arrival_order(
                [
                    (c.command_id, c.task_id, c.lease_until is not None and c.lease_until > now)
                    for c in open_
                ],
                limit=limit,
            )
            claimed = [replace(self._commands[cid], lease_until=until) for cid in picked]
            for command in claimed:
                self._commands[command.command_id] = command
            return claimed

    def claim_commands_for(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """``CommandChannel``: ``claim_commands`` among ``holder``'s tasks and nobody's."""
        return self._claim(holder, now=now, lease_seconds=lease_seconds, limit=limit)

    def _claimable_by(self, holder: str | None, task_id: str) -> bool:
        """Whether ``holder`` (``None``: anyone) may act on the task's commands."""
        if holder is None:
            return True
        s = self._tasks.get(task_id)
        return s is None or s.lease_owner in (None, holder) or s.status in TERMINAL

    def subscribe_commands(self, wake: Callable[[], None]) -> None:
        """``CommandChannel``: none (a node on this store polls)."""
        return None

    def subscribe_commands_for(self, holder: str, wake: Callable[[], None]) -> None:
        return None

    def subscribe_transitions(self, wake: Callable[[], None]) -> None:
        return None

    def pending_commands(self, task_id: str) -> list[Command]:
        """``CommandChannel``; dicts keep arrival order."""
        with self._lock:
            self._check_open()
            return [
                c for c in self._commands.values() if c.task_id == task_id and c.finished_at is None
            ]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._lock:
            self._check_open()
            command = self._commands.get(command_id)
            if command is not None:
                self._commands[command_id] = replace(
                    command, finished_at=utc(now, "now"), outcome=outcome, lease_until=None
                )

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._lock:
            self._check_open()
            command = self._commands.get(command_id)
            if command is not None and command.finished_at is None:
                self._commands[command_id] = replace(command, lease_until=None)

    # -- node declarations (FleetRegistry) ----------------------------------------------

    def declare_node(self, record: NodeRecord) -> None:
        with self._lock:
            self._check_open()
            self._nodes[record.node] = replace(record, stopped_at=None)

    def refresh_node(self, node: str, *, now: datetime, health: NodeHealth | None = None) -> bool:
        with self._lock:
            self._check_open()
            record = self._nodes.get(node)
            if record is None or record.stopped_at is not None:
                return False
            self._nodes[node] = replace(
                record, seen_at=now, health=record.health if health is None else health
            )
            return True

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        """``FleetRegistry``: ``refresh_node`` and the commands ``node`` may claim."""
        if not self.refresh_node(node, now=now, health=health):
            return None
        with self._lock:
            return sum(
                1
                for c in self._commands.values()
                if c.finished_at is None
                and (c.lease_until is None or c.lease_until <= now)
                and self._claimable_by(node, c.task_id)
            )

    def retire_node(self, node: str, *, now: datetime) -> None:
        with self._lock:
            self._check_open()
            record = self._nodes.get(node)
            if record is not None:
                self._nodes[node] = replace(record, stopped_at=now)

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            self._check_open()
            return list(self._nodes.values())

    # -- schedule declarations (FleetRegistry) --------------------------------------

    def declare_schedule(self, record: ScheduleRecord) -> None:
        with self._lock:
            self._check_open()
            self._schedules[(record.node, record.name)] = record

    def forget_schedule(self, node: str, name: str) -> None:
        with self._lock:
            self._check_open()
            self._schedules.pop((node, name), None)

    def schedules(self) -> list[ScheduleRecord]:
        with self._lock:
            self._check_open()
            return [self._schedules[key] for key in sorted(self._schedules)]

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        with self._lock:
            self._check_open()
            done = [c for c in self._commands.values() if c.finished_at and c.finished_at > after]
        done.sort(key=lambda c: c.finished_at or after)
        return done[:limit]

    # -- late reports (Maintenance) ------------------------------------------------------

    def record_late_report(self, report: LateReport) -> None:
        with self._lock:
            self._check_open()
            self._late.pop(report.task_id, None)
            self._late[report.task_id] = report

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        with self._lock:
            self._check_open()
            found = [r for r in self._late.values() if task_ids is None or r.task_id in task_ids]
        found.sort(key=lambda r: r.reported_at, reverse=True)
        return found[:limit]

    def count_late_reports(self) -> int:
        with self._lock:
            self._check_open()
            return len(self._late)

    # -- holds of a pause before the start (CommandChannel) ----------------------------------

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        with self._lock:
            self._check_open()
            self._holds[task_id] = since

    def release_hold(self, task_id: str) -> None:
        with self._lock:
            self._check_open()
            self._holds.pop(task_id, None)

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        with self._lock:
            self._check_open()
            if task_ids is not None:
                return {t: self._holds[t] for t in task_ids if t in self._holds}
            oldest = sorted(self._holds.items(), key=lambda item: item[1])[:limit]
            return dict(oldest)

    # -- pipeline shapes (FleetRegistry) ---------------------------------------------

    def record_pipeline(self, record: PipelineRecord) -> None:
        with self._lock:
            self._check_open()
            self._pipelines.pop(record.pipeline_run_id, None)
            self._pipelines[record.pipeline_run_id] = record

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        with self._lock:
            self._check_open()
            return self._pipelines.get(pipeline_run_id)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        with self._lock:
            self._check_open()
            newest = sorted(self._pipelines.values(), key=lambda r: r.created_at, reverse=True)
            return newest[:limit]

    def prune(self, *, keep_terminal: int) -> int:
        if keep_terminal < 0:
            raise ValueError(f"keep_terminal must be >= 0, got {keep_terminal}")
        with self._lock:
            self._check_open()
            terminal = [s for s in list(self._tasks.values()) if s.status in TERMINAL]
            terminal.sort(key=lambda s: s.created_at)
            doomed = terminal[: max(0, len(terminal) - keep_terminal)]
            return sum(self._forget(snapshot) for snapshot in doomed)

    def _ended(
        self,
        before: datetime,
        statuses: frozenset[TaskStatus] | None,
        buckets: frozenset[int] | None,
        limit: int,
    ) -> list[TaskSnapshot]:
        chosen = check_retention_args(before, statuses, limit)
        self._check_open()
        return sorted(
            (
                s
                for s in list(self._tasks.values())
                if s.status in chosen
                and s.ended_at is not None
                and s.ended_at < before
                and (buckets is None or s.bucket in buckets)
            ),
            key=lambda s: s.created_at,
        )

    def prune_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
        limit: int = 500,
    ) -> int:
        """``Maintenance``."""
        with self._lock:
            doomed = self._ended(before, statuses, buckets, limit)[:limit]
            return sum(self._forget(snapshot) for snapshot in doomed)

    def count_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
    ) -> int:
        """``Maintenance``."""
        with self._lock:
            return len(self._ended(before, statuses, buckets, 1))

    def prune_finished_commands(self, *, before: datetime, limit: int = 500) -> int:
        """``Maintenance``."""
        check_retention_args(before, None, limit)
        with self._lock:
            self._check_open()
            doomed = sorted(self._finished_before(before), key=lambda c: c.finished_at or before)
            for command in doomed[:limit]:
                del self._commands[command.command_id]
            return min(len(doomed), limit)

    def count_finished_commands(self, *, before: datetime) -> int:
        """``Maintenance``."""
        check_retention_args(before, None, 1)
        with self._lock:
            return len(self._finished_before(before))

    def _finished_before(self, before: datetime) -> list[Command]:
        return [
            c
            for c in self._commands.values()
            if c.finished_at is not None and c.finished_at < before
        ]

    def count_tasks(
        self, by: CountBy, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        """``Maintenance``: counted over the dictionary."""
        self._check_open()
        return ReadWhole(self).count_tasks(by, statuses=statuses)

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        self._check_open()
        return ReadWhole(self).scan_tasks(scan)

    def mark_expired_lost(
        self,
        scan: TaskScan,
        *,
        exclude: frozenset[str],
        at: datetime,
        actor: str,
        verdict: Verdict,
    ) -> list[str]:
        """``Maintenance``: the expired read, then each a ``mark_lost`` compare-and-set."""
        if scan.statuses - LOSABLE:
            raise ValueError("reconcile marks lost only what the state table allows")
        marked, _ = mark_expired_by_scan(
            self.scan_tasks,
            self.mark_lost,
            scan,
            exclude=exclude,
            at=at,
            actor=actor,
            verdict=verdict,
        )
        return marked

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """``Maintenance``."""
        self._check_open()
        return timeline_of(list(self._tasks.values()), since, width)

    def _forget(self, snapshot: TaskSnapshot) -> int:
        """Delete a finished task with its trail and late report (and its pipeline run's
        record, if it was the run's last task): 1, or 0 if it was written since it was
        judged (no longer the row judged). The caller holds ``_lock``."""
        task_id = snapshot.task_id
        with self._stripe(task_id):  # against a racing save
            if self._tasks.get(task_id) is not snapshot:
                return 0
            del self._tasks[task_id]
        self._history.pop(task_id, None)
        self._late.pop(task_id, None)
        self._holds.pop(task_id, None)
        run = snapshot.pipeline_run_id
        if run is not None:  # a pipeline run goes with its last task (under ``_lock``)
            record = self._pipelines.get(run)
            if record is not None and not any(t in self._tasks for t in record.tasks.values()):
                del self._pipelines[run]
        key = snapshot.dedupe_key
        if key is not None:
            with self._dedupe_lock:  # a create with the key may be setting it
                if self._keyed.get(key) == task_id:
                    del self._keyed[key]  # finished: the key was free either way
        return 1

    def close(self) -> None:
        self._closed = True


def _touched(
    current: TaskSnapshot,
    progress: Progress | None,
    heartbeat_at: datetime | None,
    lease_owner: str | None,
    lease_until: datetime | None,
) -> TaskSnapshot:
    """``current`` with the given side-channel columns (``None``: as is)."""
    return current.evolve(
        progress=current.progress if progress is None else progress,
        last_heartbeat_at=current.last_heartbeat_at if heartbeat_at is None else heartbeat_at,
        lease_owner=current.lease_owner if lease_owner is None else lease_owner,
        lease_until=current.lease_until if lease_until is None else lease_until,
    )
