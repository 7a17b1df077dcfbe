"""``ScheduleRunner``: the node service that fires the schedules a node declares
(``chongming_task.schedules`` holds the schedules and their triggers): ``run_once()``
fires every schedule due by the node's clock, and writes each schedule's record for
people (``schedules`` in the CLI).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import ChongmingTaskError, ConfigurationError
from ..model import ScheduleRecord
from ..schedules import Schedule, Submit, slot_task_id
from .services import LoopService, NodeContext, Pass

if TYPE_CHECKING:
    from ..run.handle import TaskRun
    from ..run.stored import StoredTask

__all__ = ["ScheduleRunner"]

log = logging.getLogger("chongming_task.schedules")


class ScheduleRunner(LoopService):
    """Fires a node's schedules: ``run_once()`` fires every schedule due by the clock now.

    With ``run_schedules=False`` a controller never starts its thread and tests drive it
    through ``Controller.tick_schedules()`` with a fake clock, without sleeping.
    """

    def __init__(
        self,
        node: NodeContext,
        *,
        rng: random.Random,
        submit: Submit,
        accepting: Callable[[], bool],
        owns: Callable[[str | None], bool],
        follow: Callable[[str], StoredTask],
    ) -> None:
        """``submit`` fires a slot; ``owns`` says whether a bucket key is this node's to
        run; ``follow`` is a handle on a task in the store (a slot another node took)."""
        super().__init__()
        self.name = f"chongming-scheduler[{node.owner}]"
        self._owner = node.owner
        self._caps = node.capabilities
        self._unrecorded = False  # a record failed: warned once
        self._now = node.now
        self._rng = rng
        self._submit = submit
        self._accepting = accepting
        self._owns = owns
        self._follow = follow
        self._lock = threading.Lock()
        self._schedules: dict[str, Schedule] = {}

    def add(self, entry: Schedule) -> None:
        with self._lock:
            if entry.name in self._schedules:
                raise ConfigurationError(f"a schedule named {entry.name!r} exists already")
            self._advance(entry, self._now())
            self._schedules[entry.name] = entry
        self._record([entry])
        self.wake()

    def remove(self, name: str) -> None:
        with self._lock:
            if self._schedules.pop(name, None) is None:
                raise ConfigurationError(f"no schedule named {name!r}")
        self._store_call(self._caps.forget_schedule, self._owner, name)

    def retire(self) -> None:
        """A clean close: the node's schedules fire no more, so their records go."""
        for entry in self.entries():
            self._store_call(self._caps.forget_schedule, self._owner, entry.name)

    def _record(self, entries: Iterable[Schedule]) -> None:
        """Write each schedule's record for people (``schedules`` in the CLI). A failed
        write costs the schedule nothing: it is logged, and the next firing writes again."""
        now = self._now()
        for entry in entries:
            last = entry.last_run
            record = ScheduleRecord(
                node=self._owner,
                name=entry.name,
                task=entry.task_name or str(entry.task),
                trigger=str(entry.trigger),
                updated_at=now,
                next_fire_at=entry.due,
                last_fired_at=entry.last_fired,
                last_task_id=None if last is None else last.task_id,
                fired=entry.fired,
                skipped=entry.skipped_overlap + entry.skipped_misfire,
            )
            self._store_call(self._caps.declare_schedule, record)

    def _store_call(self, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except ChongmingTaskError as exc:
            level = logging.DEBUG if self._unrecorded else logging.WARNING
            self._unrecorded = True
            log.log(level, "schedule records not written (firing goes on): %s", exc)

    def entries(self) -> list[Schedule]:
        with self._lock:
            return list(self._schedules.values())

    def run_once(self, now: float | None = None) -> Pass:
        """Fire what is due (``done``: the runs submitted); wait until the next due."""
        # Schedules live in wall-clock time: tick() reads the node's clock (a FakeClock in
        # tests), not the monotonic ``now``.
        fired = len(self.tick())
        dues = [e.due for e in self.entries() if e.due is not None]
        if not dues:
            return Pass(done=fired, wait=1.0)
        wait = min(1.0, max(0.01, (min(dues) - self._now()).total_seconds()))
        return Pass(done=fired, wait=wait)

    def tick(self) -> list[TaskRun | StoredTask]:
        """Fire every schedule that is due now; return the runs submitted. A firing is
        skipped while the previous run is active (``overlap="skip"``) or when it is later
        than ``misfire_grace``; missed firings coalesce into one."""
        now = self._now()
        fired: list[TaskRun | StoredTask] = []
        moved: list[Schedule] = []
        with self._lock:
            if not self._accepting():
                return fired
            for entry in self._schedules.values():
                if entry.due is None or entry.due > now:
                    continue
                # The slot: the latest instant due (missed ones coalesce into it).
                slot = entry.trigger.latest_at_or_before(now) or entry.next_fire
                if slot is not None and not self._reach(entry, slot, now, fired):
                    continue  # its submit failed: tried again at the next tick
                self._advance(entry, now)
                moved.append(entry)
        self._record(moved)
        return fired

    def _reach(
        self, entry: Schedule, slot: datetime, now: datetime, fired: list[TaskRun | StoredTask]
    ) -> bool:
        """Fire ``slot`` of ``entry``, or skip it saying why; ``False`` when its submit
        failed (the slot is tried again). Caller holds the lock."""
        late = (now - slot).total_seconds()
        if not self._owns(entry.bucket_key):
            entry.skipped_elsewhere += 1  # its bucket's owner fires it
        elif entry.overlap == "skip" and entry.active:
            entry.skipped_overlap += 1
            log.info("schedule %s: previous run still active, firing skipped", entry.name)
        elif entry.misfire_grace is not None and late > entry.misfire_grace:
            entry.skipped_misfire += 1
            log.warning("schedule %s: firing %.1fs late, skipped", entry.name, late)
        else:
            try:
                run = self._submit(entry, slot)
            except ChongmingTaskError:
                log.exception("schedule %s: submit failed; will try again", entry.name)
                return False
            if run is None:  # another node fired this slot first
                self._taken(entry, slot)
            else:
                entry.last_run = run
                entry.last_fired = now
                entry.fired += 1
                fired.append(run)
        return True

    def _taken(self, entry: Schedule, slot: datetime) -> None:
        """A slot another node fired: its task answers for this node's ``overlap``, and
        the node that ran it is noted (one read of the store)."""
        task_id = slot_task_id(entry.name, slot)
        entry.taken += 1
        entry.last_run = handle = self._follow(task_id)
        try:
            entry.last_taken_by = handle.snapshot().owner
        except ChongmingTaskError as exc:
            log.debug("schedule %s: who fired %s not read: %s", entry.name, task_id, exc)
        log.debug("schedule %s: slot %s fired by %s", entry.name, slot, entry.last_taken_by)

    def _advance(self, entry: Schedule, now: datetime) -> None:
        entry.next_fire = entry.trigger.next_after(now)
        delay = self._rng.uniform(0, entry.jitter) if entry.jitter else 0.0
        entry.due = entry.next_fire + timedelta(seconds=delay)
