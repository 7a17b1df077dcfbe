"""``RunWrites``: how one run's transitions reach the store, and the one face its writers
see.

A run makes a transition under its state lock and hands it here (``queue``) with the
snapshot it leads to. Whoever holds the run's *write lock* writes everything queued, in
order, before letting go: the run itself (inline, ``write``), or the worker or the
writer's thread through a ``BehindWriter`` (the hand-over is ``hand_off``). No store I/O
happens under the state lock that the task's ``checkpoint()`` needs. The lock order is:
write lock, then state lock; under the state lock the write lock is only tried without
waiting (``take_if_free``) or let go, so the order can never deadlock. The write lock is
a plain ``Lock``: a writer thread lets go of a lock a worker took.

The write-through survives failed writes (docs/design.md, "Write-through"). ``save``
expects the version *last actually written*, never "this version minus one", so one
failed write does not freeze the task in the store. Transitions whose write failed wait
in a bounded buffer and land with the next write, from the supervisor's catch-up, or at
``close()``; the stored version then jumps several at once. A conflict against the
version actually written means another writer changed the task: write-through stops for
it (``desynced``) and the node lists it. Each write is one ``compare_and_write`` of the
store's ``Capabilities``: one transaction where the store offers one, the compare-and-set
first, so only the writer whose CAS succeeded records the version in the trail.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from .. import states
from ..errors import ConcurrencyConflict
from ..model import (
    JSONValue,
    TaskSnapshot,
    Transition,
    snapshot_changer,
    trusted_transition,
    utc,
)
from ..model import TaskStatus as S
from ..stores.capabilities import PartialWrite
from ..trail import TRAIL_WIDTH, Trail, trail_items
from .host import Handoff, Taken, WritesHost

__all__ = ["Handoff", "RunWrites", "Taken", "WritesHost"]

log = logging.getLogger("chongming_task.writethrough")

# The statuses the moves every attempt makes name, as module globals: on Python 3.11
# each ``TaskStatus.X`` is a lookup through the enum's class attribute hook (61 ns
# against 6 ns for a global; nine a no-op attempt, about 3 % of the in-memory row).
_STARTING, _RUNNING, _SUCCEEDED = S.STARTING, S.RUNNING, S.SUCCEEDED

# What a start and a success change (``RunWrites.start``, ``RunWrites.succeed``).
_START_CHANGES = snapshot_changer(("status", "status_version", "attempt", "started_at"))
_SUCCESS_CHANGES = snapshot_changer(("status", "status_version", "ended_at", "outcome", "failure"))


class RunWrites:
    """One run's transitions: made through the one table (``move``), kept in its trail,
    and brought to the store. ``move``, ``start``, ``succeed`` and ``take_if_free`` are
    called holding the run's state lock; every other method takes what it needs."""

    # Slots: a node holds many runs, and an instance dict is one more object for the
    # cyclic garbage collector to walk on every full collection.
    __slots__ = (
        "_buffer",
        "_desynced",
        "_dropped",
        "_error",
        "_host",
        "_lock",
        "_on_end",
        "_reported",
        "_unwritten",
        "_write_lock",
        "_written",
        "snapshot",
        "stored_instead",
        "task_id",
        "trail",
    )

    def __init__(
        self,
        host: WritesHost,
        snapshot: TaskSnapshot,
        created: Transition,
        *,
        lock: threading.RLock,
        on_end: Callable[[], None],
    ) -> None:
        """``created`` is the transition that creates the task; ``lock`` is the run's
        state lock; ``on_end`` is called once, holding the write lock, when a terminal
        snapshot has been written (or buffered)."""
        self.task_id = snapshot.task_id
        self.snapshot = snapshot
        """The run's latest snapshot (changed only under the state lock)."""
        self.trail: Trail = trail_items(created)
        """Every transition this process made, in order. A ``Trail``, not
        ``Transition`` objects: a held run's history is then nothing the garbage
        collector walks."""
        self._host = host
        self._lock = lock
        self._write_lock = threading.Lock()
        self._on_end: Callable[[], None] | None = on_end
        self._unwritten: tuple[Transition, ...] | None = None  # made, not yet taken
        self._written = 0  # the version last actually written (``save`` expects it)
        self._buffer: deque[Transition] | None = None  # failed writes; made on the first
        self._desynced = False
        self._reported = False  # a desynced run's end, reported late
        self.stored_instead: TaskSnapshot | None = None
        """Once desynced: what the store holds instead (``None``: not read)."""
        self._dropped = 0  # transitions dropped from a full buffer
        self._error: BaseException | None = None  # why the latest write failed

    # -- making transitions (the state lock held) ------------------------------------------

    def move(
        self,
        steps: tuple[tuple[S, str | None], ...],
        actor: str | None,
        changes: dict[str, Any],
        stamp: tuple[str, ...] = (),
    ) -> TaskSnapshot:
        """Make ``steps`` (each a status and the trail's reason): ``states`` checks every
        step against the one table, one snapshot is made for where they lead (with
        ``changes``, and the transition time in each field named in ``stamp``), and a
        ``Transition`` a step is queued to be written. Caller holds the state lock."""
        current = self.snapshot
        status = current.status
        for to, _ in steps:
            if not states.is_legal(status, to):
                states.check(current.task_id, status, to)  # raises, with the ids
            status = to
        now = self._now()
        for name in stamp:
            changes[name] = now
        if status in states.TERMINAL and "ended_at" not in changes:
            changes["ended_at"] = now
        actor = actor or self._host.owner
        version, was = current.status_version, current.status
        made: list[Transition] = []
        for to, reason in steps:
            version += 1
            transition = trusted_transition(
                task_id=current.task_id,
                version=version,
                from_status=was,
                to_status=to,
                at=now,
                reason=reason,
                actor=actor,
            )
            self.trail += trail_items(transition)
            made.append(transition)
            was = to
        changes["status"] = status
        changes["status_version"] = version
        snapshot = snapshot_changer(tuple(changes))(current, *changes.values())
        self.queue(snapshot, *made)
        return snapshot

    # The two moves every attempt makes, with their snapshot changers made once: each
    # asks the one table as ``move`` does and makes what it makes (a test holds them to
    # it), without its dict of changes and loops. Through ``move``, one no-op attempt on
    # the in-memory store took 10.7 us against 7.0 us, and the in-memory throughput row
    # fell to 0.63x of what it is with them (bench/throughput_then_now.py).

    def start(self, attempt_no: int, reason: str) -> None:
        """``queued -> starting -> running`` for a task that reported no activity since
        it last ran: two transitions, one snapshot and one write (the stored version
        jumps by two). Caller holds the state lock."""
        current = self.snapshot
        states.check(current.task_id, current.status, _STARTING)
        states.check(current.task_id, _STARTING, _RUNNING)
        now = self._now()
        task_id, owner, version = current.task_id, self._host.owner, current.status_version
        starting = trusted_transition(
            task_id=task_id,
            version=version + 1,
            from_status=current.status,
            to_status=_STARTING,
            at=now,
            reason=reason,
            actor=owner,
        )
        running = trusted_transition(
            task_id=task_id,
            version=version + 2,
            from_status=_STARTING,
            to_status=_RUNNING,
            at=now,
            reason=None,
            actor=owner,
        )
        self.trail += trail_items(starting) + trail_items(running)
        self.queue(
            _START_CHANGES(current, _RUNNING, version + 2, attempt_no, now), starting, running
        )

    def succeed(self, outcome: JSONValue) -> None:
        """``running -> succeeded`` for a task that reported no activity. Caller holds
        the state lock."""
        current = self.snapshot
        states.check(current.task_id, current.status, _SUCCEEDED)
        now = self._now()
        version = current.status_version + 1
        ended = trusted_transition(
            task_id=current.task_id,
            version=version,
            from_status=current.status,
            to_status=_SUCCEEDED,
            at=now,
            reason=None,
            actor=self._host.owner,
        )
        self.trail += trail_items(ended)
        self.queue(_SUCCESS_CHANGES(current, _SUCCEEDED, version, now, outcome, None), ended)

    def _now(self) -> datetime:
        now = self._host.clock.now()
        return now if now.tzinfo is UTC else utc(now, "clock.now()")

    # -- what the run calls ----------------------------------------------------------------------

    def queue(self, snapshot: TaskSnapshot, *transitions: Transition) -> None:
        """``snapshot`` is the run's latest, and ``transitions`` led to it: write them
        next. Caller holds the state lock."""
        self.snapshot = snapshot
        # A tuple: the common write is one transition (no list for the collector).
        unwritten = self._unwritten
        self._unwritten = transitions if unwritten is None else unwritten + transitions

    def write(self, *, soon: bool = False) -> None:
        """Write what is queued and return once it is in the store (or buffered after a
        failed write). If another thread holds the write lock, it writes the queue before
        it lets go, and this returns once it has. Never called holding the state lock.
        ``soon``: hand it to the node's writer where it has one, without waiting (the
        event loop of async tasks never waits on the store)."""
        if soon:
            self.hand_off(self.take())
            return
        self._write_lock.acquire()
        taken = self._let_go()
        if taken is not None:
            self.write_taken(taken)

    def take_if_free(self) -> Taken | None:
        """The hot path's shortcut, holding the state lock: if the write lock is free,
        take it (without waiting: never the wrong order) with the queue; else ``None``,
        and the lock's holder writes the queue before it lets go."""
        if self._unwritten is None or not self._write_lock.acquire(False):
            return None
        pending, self._unwritten = self._unwritten, None
        return pending, self.snapshot

    def take(self) -> Taken | None:
        """``take_if_free``, taking the state lock itself (a writer thread's hand-over)."""
        with self._lock:
            return self.take_if_free()

    def hand_off(self, taken: Taken | None) -> None:
        """A worker's write of what ``take_if_free`` took, after the state lock is let
        go: to the node's writer if it has one (the worker goes on at once), else here.
        ``None``: the write lock's holder writes the queue (without a writer this waits
        for it, so the worker's write is in the store when it returns)."""
        writer = self._host.writer
        if taken is None:
            if writer is None:
                self.write()
        elif writer is None:
            self.write_taken(taken)
        else:
            writer.put(self, taken)

    def stored(self, created: Transition, *, appended: bool) -> None:
        """The store accepted the run's ``create`` (and, if ``appended``, the creation
        transition ``created``); write whatever was queued meanwhile (a command may have
        reached the run already)."""
        self._write_lock.acquire()
        self._written = created.version
        with self._lock:
            if not appended:
                self._unwritten = (created,) + (self._unwritten or ())
            pending = self._unwritten
            if pending is None:
                self._write_lock.release()
                return
            self._unwritten = None
            snapshot = self.snapshot
        self.write_taken((pending, snapshot))

    def catch_up(self, refreshed: Callable[[TaskSnapshot], TaskSnapshot]) -> bool:
        """Retry buffered writes, writing the snapshot as ``refreshed`` makes it (with
        the token's latest activity); returns whether the store is up to date."""
        self.write()
        self._write_lock.acquire()
        try:
            with self._lock:
                snapshot = refreshed(self.snapshot)
            if self.behind_of(snapshot):
                self._flush(snapshot)
        except BaseException:
            self._write_lock.release()
            raise
        more = self._let_go()
        if more is not None:  # transitioned meanwhile
            self.write_taken(more)
        return not self.behind_of(self.snapshot)

    # -- what a holder of the write lock calls (the run, its writer) -------------------------

    def write_taken(self, taken: Taken) -> None:
        """Write ``taken`` (the write lock held) and what is queued meanwhile; let go."""
        while True:
            pending, snapshot = taken
            try:
                self.persist(snapshot, pending)
            except BaseException:
                self._write_lock.release()
                raise
            more = self.written(snapshot)
            if more is None:
                return
            taken = more

    def take_more(self, taken: Taken) -> Taken:
        """What ``taken`` holds and whatever was queued since: one write of the latest
        snapshot, every transition in order (the write lock held)."""
        with self._lock:
            more = self._unwritten
            if more is None:
                return taken
            self._unwritten = None
            return taken[0] + more, self.snapshot

    def written(self, snapshot: TaskSnapshot) -> Taken | None:
        """``snapshot`` was written (or buffered), the write lock held. A terminal one
        ends the run (its ``wait()`` returns once its end is in the store). Then what
        was queued meanwhile, the lock kept, to write next; or ``None``, the lock let
        go. Without a writer nobody leaves a write to the holder (a worker that finds
        the lock busy waits for it), so the lock is let go at once."""
        on_end = self._on_end
        if self._desynced and snapshot.status in states.TERMINAL:
            self._report_late()
        if on_end is not None and snapshot.status in states.TERMINAL:
            self._on_end = None  # once; and the run is no longer held from here
            try:
                on_end()
            except BaseException:
                self._write_lock.release()
                raise
        if self._host.writer is None:
            self._write_lock.release()
            return None
        return self._let_go()

    def _let_go(self) -> Taken | None:
        """Holding the write lock: take what is queued, keeping the lock, or let go of it
        if nothing is. Under the state lock, so a transition queued meanwhile either is
        taken here or finds the lock free (``take_if_free``): none is left behind."""
        with self._lock:
            pending = self._unwritten
            if pending is None:
                self._write_lock.release()
                return None
            self._unwritten = None
            return pending, self.snapshot

    # -- the write-through (the write lock held) ---------------------------------------------

    @property
    def expected_version(self) -> int:
        """The version last actually written: what the next compare-and-set expects."""
        return self._written

    @property
    def desynced(self) -> bool:
        """Another writer changed the task in the store: nothing is written any more."""
        return self._desynced

    @property
    def error(self) -> BaseException | None:
        """Why the latest write failed (``None``: none has, or one succeeded since)."""
        return self._error

    @property
    def dropped(self) -> int:
        """Transitions dropped from a full buffer (missing from the trail, honestly)."""
        return self._dropped

    @property
    def behind(self) -> bool:
        """Whether the store lacks a transition this process made (never, once
        desynced: it never will have them)."""
        return self.behind_of(self.snapshot)

    def behind_of(self, snapshot: TaskSnapshot) -> bool:
        return not self._desynced and (
            bool(self._buffer) or snapshot.status_version != self._written
        )

    def shares(self, snapshot: TaskSnapshot) -> bool:
        """Whether the write of ``snapshot`` may be queued behind with other runs' (one
        write of the store's): nothing buffered, not desynced, a version to write."""
        return not (self._desynced or self._buffer or snapshot.status_version == self._written)

    def persist(self, snapshot: TaskSnapshot, pending: tuple[Transition, ...]) -> bool:
        """Write ``snapshot`` and the transitions that led to it (``pending``, in order,
        after anything still buffered). Returns whether the store is now up to date;
        never raises for a store's failure."""
        if self._desynced:
            return False
        buffer = self._buffer
        if not buffer:  # the common case: written at once, nothing buffered
            if snapshot.status_version == self._written:
                return self._flush(snapshot, pending) or self.keep(pending)
            try:
                self._host.capabilities.compare_and_write(
                    snapshot, expect_version=self._written, transitions=pending
                )
            except Exception as exc:
                return self.settle(snapshot, exc, len(pending), not pending) or self.keep(pending)
            self._written = snapshot.status_version
            self._error = None
            return True
        if len(buffer) == self._host.writethrough_buffer:
            self._dropped += 1
            log.error(
                "task %s: write-through buffer full; the oldest unwritten transition is "
                "dropped from the audit trail (the snapshot will still catch up)",
                self.task_id,
            )
        buffer.extend(pending)
        return self._flush(snapshot)

    def desync(
        self, exc: ConcurrencyConflict, *, read: tuple[TaskSnapshot | None] | tuple[()] = ()
    ) -> None:
        """Another writer changed the task in the store (``exc`` says how it showed):
        nothing of this run is written any more. The store's view is read once (what
        ``wait()`` then tells), unless the caller has just read it (``read``: that
        view); a run that has ended here is reported late at once."""
        if self._desynced:
            return
        self._buffer = None
        self.stored_instead = read[0] if read else self._read_stored()
        # The node lists it before the run says so: whoever sees ``desynced`` sees both.
        self._host.desynced(self.task_id, exc, self.snapshot, self.stored_instead)
        self._desynced = True
        if self.snapshot.is_terminal:
            self._report_late()

    def _report_late(self) -> None:
        """Once: this run's end, for the late report kept beside the task."""
        if not self._reported:
            self._reported = True
            self._host.report_late(self.snapshot)

    def refuse(self, what: str) -> bool:
        """The store refused ``what`` (a lease renewal, the run's activity), a write
        beside the write-through: its row is finished or held by another node. Desynced
        at once, unless the run has ended here meanwhile (its own end is then what the
        store holds). Takes the write lock, so no write is in flight. Returns whether it
        desynced."""
        if self._desynced:
            return False
        self._write_lock.acquire()
        try:
            with self._lock:
                ended = self.snapshot.is_terminal
            if not ended:
                self.desync(
                    ConcurrencyConflict(
                        f"{what} refused: the stored task is finished or held by another node"
                    )
                )
        finally:
            taken = self._let_go()
        if taken is not None:
            self.write_taken(taken)
        return not ended

    def keep(self, pending: tuple[Transition, ...]) -> bool:
        """After a failed write of ``pending`` (nothing buffered before it): keep them
        for the catch-up, unless the task is desynced. Returns ``False``."""
        if not self._desynced:
            if self._buffer is None:
                self._buffer = deque(maxlen=self._host.writethrough_buffer)
            self._buffer.extend(pending)
            self._host.behind(self.task_id)
        return False

    def settle(
        self, snapshot: TaskSnapshot, exc: BaseException | None, pending: int, catching_up: bool
    ) -> bool:
        """Take in how the write of ``snapshot`` (and ``pending`` transitions) went;
        returns whether the store is now up to date."""
        if exc is None:
            self._written = snapshot.status_version
            if self._buffer:
                self._buffer.clear()
            self._error = None
            return True
        if isinstance(exc, PartialWrite):
            # The save landed, an append did not: the stored version moved. The trail
            # stays buffered (appends are idempotent, so rewriting them is harmless).
            self._written = snapshot.status_version
        elif isinstance(exc, ConcurrencyConflict):
            stored = self._read_stored()
            if not self._landed_unheard(snapshot, stored):
                self.desync(exc, read=(stored,))
                return False
            # An earlier write of ours had landed though it raised: the catch-up writes
            # the rest from the version it left (the caller keeps ``pending``).
            if catching_up:
                self._host.behind(self.task_id)
            return False
        self._error = exc
        # A store fault is one episode for the node (one line when it starts, one when
        # it ends), however many tasks' writes it fails.
        self._host.write_failed(self.task_id, exc)
        log.debug(
            "task %s: write-through failed (%s: %s); %d transition(s) buffered, will catch up",
            self.task_id,
            type(exc).__name__,
            exc,
            pending,
        )
        if catching_up:
            self._host.behind(self.task_id)
        return False

    def _read_stored(self) -> TaskSnapshot | None:
        """The task as the store holds it; ``None`` where it holds none or cannot be
        read (the store's word is then unknown)."""
        try:
            return self._host.capabilities.store.get(self.task_id)
        except Exception:
            return None

    def _landed_unheard(self, snapshot: TaskSnapshot, stored: TaskSnapshot | None) -> bool:
        """After a version conflict: whether ``stored`` (the task as just read) is one of
        this run's own writes that failed as far as it knew (the connection died before
        the commit was acknowledged: docs/design.md, "A commit nobody heard"). So it is if
        the stored version lies past the one last written and up to ``snapshot``'s, holds
        the status this run's trail made at that version, and no other node holds the
        task. Then that version is taken as written. Nothing read: not (the conflict
        stands)."""
        if stored is None or not self._written < stored.status_version <= snapshot.status_version:
            return False
        if stored.lease_owner not in (None, self._host.owner):
            return False
        trail = self.trail
        for i in range(0, len(trail), TRAIL_WIDTH):
            if trail[i] == stored.status_version:
                if trail[i + 2] != stored.status.value:
                    return False
                log.info(
                    "task %s: a write that failed had landed (version %d); catching up from there",
                    self.task_id,
                    stored.status_version,
                )
                self._written = stored.status_version
                return True
        return False

    def _flush(self, snapshot: TaskSnapshot, pending: Sequence[Transition] = ()) -> bool:
        """Bring the store up to ``snapshot``: the buffer, then ``pending`` (transitions
        the caller has not buffered; none when catching up). Returns whether it is now up
        to date."""
        if self._desynced:
            return False
        catching_up = not pending
        if self._buffer:
            pending = [*self._buffer, *pending]
        capabilities = self._host.capabilities
        try:
            if snapshot.status_version != self._written:
                capabilities.compare_and_write(
                    snapshot, expect_version=self._written, transitions=pending
                )
            else:  # the row is current, only the trail is behind
                capabilities.write_transitions(snapshot, expect_version=None, transitions=pending)
        except Exception as exc:
            return self.settle(snapshot, exc, len(pending), catching_up)
        return self.settle(snapshot, None, len(pending), catching_up)
