"""``TaskRun``: one task's lifecycle, and the handle ``submit`` returns.

Every status change goes through ``_apply``: ``states`` checks legality, the snapshot is
replaced and a ``Transition`` made and queued under the run's state lock; ``_write``
persists the queue through ``WriteThrough`` holding only the run's write lock. Control
calls (stop/pause/resume/cancel) arrive from any thread; the token hears them once their
transition is in the store, and the task at its next ``checkpoint``. The carrier side
(one attempt on a worker thread) is ``carrier.Carrier``.
"""

from __future__ import annotations

import logging
import threading
from _thread import RLock as _RLock
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from .. import states
from ..errors import TaskUnsuccessful, WaitTimeout
from ..model import ControlOutcome as O
from ..model import (
    Failure,
    FailureKind,
    JSONValue,
    Progress,
    TaskSnapshot,
    Trail,
    Transition,
    snapshot_changer,
    trail_items,
    trail_transitions,
    trusted_transition,
    utc,
)
from ..model import TaskStatus as S
from ..values import check_text
from .attempt import Carrier, RunHost, Taken
from .token import CancellationToken, StopKind
from .writes import WriteThrough

if TYPE_CHECKING:
    from ..definitions import TaskDefinition
    from ..pipelines import PipelineRun

__all__ = [
    "RunHost",
    "TaskRun",
    "activity_flushed",
    "cancel_waiting",
    "carrier_crashed",
    "catch_up",
    "check_timeout",
    "dependencies_met",
    "execute",
    "lease_due",
    "lease_renewed",
    "stored",
    "unflushed_activity",
]

log = logging.getLogger("chongming_task.run")


class TaskRun(Carrier, WriteThrough):
    """A submitted task: ``task_id``, ``wait()``, ``result()``, ``snapshot()``, control."""

    # Slots: a node holds many runs, and every instance dict is one more object for the
    # cyclic garbage collector to walk on each full collection.
    __slots__ = (
        "_args",
        "_deadline",
        "_done",
        "_finished",
        "_flushed_activity",
        "_grace_deadline",
        "_history",
        "_host",
        "_kwargs",
        "_lease_renew_at",
        "_lock",
        "_paused_at",
        "_snapshot",
        "_unwritten",
        "_write_lock",
        "_wt_buffer",
        "_wt_desynced",
        "_wt_dropped",
        "_wt_error",
        "_wt_written",
        "abandoned",
        "definition",
        "node_key",
        "pipeline",
        "task_id",
        "token",
    )

    def __init__(
        self,
        host: RunHost,
        definition: TaskDefinition,
        snapshot: TaskSnapshot,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._host = host
        self.task_id: Final[str] = snapshot.task_id  # an attribute: read on every hot path
        self.definition = definition
        self._args = args
        self._kwargs = kwargs
        # Two locks: _lock guards the state (the token shares it, so checkpoint() takes
        # it); _write_lock orders the store writes, which happen holding it alone. Order:
        # _write_lock, then _lock; while holding _lock, _write_lock is only ever tried
        # without waiting (_take_if_free) or let go (_let_go), so the order can never
        # deadlock. The write lock is a plain Lock: the writer thread lets go of a lock
        # a worker took.
        self._lock = _RLock()  # threading.RLock() is a Python function around it
        self._write_lock = threading.Lock()
        self._unwritten: tuple[Transition, ...] | None = None  # made, not yet written
        self._finished = False
        self._done: threading.Event | None = None  # made by the first waiter: runs are many
        self._snapshot = snapshot
        # A Trail, not Transitions: a held run's history is then nothing the garbage
        # collector walks.
        self._history: Trail = ()
        self.token = CancellationToken(
            snapshot.task_id,
            host.clock,
            on_pause_ack=self._ack_pause,
            lock=self._lock,
            rules=host.value_rules,
        )
        # The write-through's state (WriteThrough): nothing written yet, nothing failed.
        self._wt_written = 0
        self._wt_buffer = None
        self._wt_desynced = False
        self._wt_dropped = 0
        self._wt_error = None
        self.abandoned = False
        self.pipeline: PipelineRun | None = None  # set for pipeline nodes
        self.node_key: str | None = None
        self._deadline: float | None = None
        self._grace_deadline: float | None = None
        self._paused_at: float | None = None
        self._flushed_activity = 0
        self._lease_renew_at = 0.0  # monotonic time when the controller renews the lease

    def __repr__(self) -> str:
        s = self._snapshot
        return f"<TaskRun {s.task_id} {s.name} {s.status.value} v{s.status_version}>"

    # -- the handle ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._snapshot.name

    @property
    def status(self) -> S:
        return self._snapshot.status

    @property
    def bucket(self) -> int | None:
        return self._snapshot.bucket

    def snapshot(self) -> TaskSnapshot:
        """This process's view of the task, with the latest progress and heartbeat."""
        with self._lock:
            return self._refreshed(self._snapshot)

    def history(self) -> list[Transition]:
        """Every transition this process made, in order (the store's trail may be behind)."""
        with self._lock:
            history = self._history
        return trail_transitions(self.task_id, history)

    def done(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None = None) -> TaskSnapshot:
        """Block until the task is terminal; return its final snapshot.

        Raises ``WaitTimeout`` if it is not terminal within ``timeout`` seconds.
        """
        if self._finished:
            return self.snapshot()
        with self._lock:
            if self._done is None:
                self._done = threading.Event()
                if self._finished:
                    self._done.set()
            done = self._done
        if not done.wait(timeout):
            raise WaitTimeout(
                f"task {self.task_id} still {self._snapshot.status.value} after {timeout}s"
            )
        return self.snapshot()

    def result(self, timeout: float | None = None) -> JSONValue:
        """The task's return value; raises ``TaskUnsuccessful`` if it did not succeed."""
        final = self.wait(timeout)
        if final.status is not S.SUCCEEDED:
            raise TaskUnsuccessful(final)
        return final.outcome

    # -- the one path every transition takes --------------------------------------------------

    def _activity(self) -> dict[str, Any]:
        """``refresh_activity``: the token's heartbeat and progress (which the background
        loop writes via ``touch``) as snapshot changes, so a ``save`` never writes them
        back older. Empty while the task has not reached a checkpoint."""
        if not self.token.checkpointed:
            return {}
        _, progress, heartbeat = self.token.activity()
        changes: dict[str, Any] = {}
        if progress is not None:
            changes["progress"] = progress
        if heartbeat is not None:
            changes["last_heartbeat_at"] = heartbeat
        return changes

    def _refreshed(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        changes = self._activity()
        return snapshot.evolve(**changes) if changes else snapshot

    def _apply(
        self,
        to: S,
        *,
        reason: str | None = None,
        actor: str | None = None,
        **changes: Any,
    ) -> TaskSnapshot:
        """Make one transition (``_start`` is the one other path): ``states`` checks it,
        the snapshot is replaced and a ``Transition`` made and queued for the store. The
        caller calls ``_write()`` once it has let go of the lock: no store I/O happens
        under the lock the task's ``checkpoint()`` needs."""
        with self._lock:
            current = self._snapshot
            if not states.is_legal(current.status, to):
                states.check(current.task_id, current.status, to)  # raises, with the ids
            now = self._host.clock.now()
            if now.tzinfo is not UTC:  # inline: SystemClock's reading is UTC already
                now = utc(now, "clock.now()")
            version = current.status_version + 1
            if to in states.TERMINAL and "ended_at" not in changes:
                changes["ended_at"] = now
            if self.token.checkpointed:
                changes.update(self._activity())
            changes["status"] = to
            changes["status_version"] = version
            snapshot = snapshot_changer(tuple(changes))(current, *changes.values())
            transition = trusted_transition(
                task_id=current.task_id,
                version=version,
                from_status=current.status,
                to_status=to,
                at=now,
                reason=reason,
                actor=actor or self._host.owner,
            )
            self._snapshot = snapshot
            self._history += trail_items(transition)
            # Queued for the next ``_write()`` (inline: every transition passes here).
            self._unwritten = (
                (transition,) if self._unwritten is None else (*self._unwritten, transition)
            )
            return snapshot

    def _queue(self, *transitions: Transition) -> None:
        """Hand transitions to the next ``_write()``. Caller holds the lock."""
        # A tuple: the common write is one transition, and its "earlier" part is then the
        # shared empty tuple (no list per write for the garbage collector).
        self._unwritten = transitions if self._unwritten is None else self._unwritten + transitions

    def _write(self) -> None:
        """Write the queued transitions with the snapshot they lead to, in order, holding
        only the write lock; returns once they are in the store (or buffered after a
        failed write). If another thread holds the lock, it writes them before it lets go
        (``_let_go``), and this returns once it has. Never called holding the state
        lock."""
        self._write_lock.acquire()
        taken = self._let_go()
        if taken is not None:
            self._write_held(taken)

    def _let_go(self) -> Taken | None:
        """Holding the write lock: take what is queued, keeping the lock, or let go of the
        lock if nothing is. Under the state lock, so a transition queued meanwhile either
        is taken here or finds the lock free (``_take_if_free``): whoever holds the write
        lock writes everything queued before it lets go, and none is left behind."""
        with self._lock:
            pending = self._unwritten
            if pending is None:
                self._write_lock.release()
                return None
            self._unwritten = None
            return pending, self._snapshot

    def _write_held(self, taken: Taken) -> None:
        """Write ``taken`` (the write lock held) and what is queued meanwhile; let go."""
        while True:
            pending, snapshot = taken
            try:
                self._wt_persist(snapshot, pending)
            except BaseException:
                self._write_lock.release()
                raise
            more = self._written_held(snapshot)
            if more is None:
                return
            taken = more

    def _written_held(self, snapshot: TaskSnapshot) -> Taken | None:
        """``snapshot`` was written (or buffered), the write lock held: whoever writes a
        terminal transition ends the run (``wait()`` returns once its end is in the
        store). Then ``_let_go``: what was queued meanwhile, to write next. Without a
        writer nobody leaves a write to the holder (a worker that finds the lock busy
        waits for it), so the lock is let go at once."""
        if snapshot.status in states.TERMINAL:
            try:
                self._end()
            except BaseException:
                self._write_lock.release()
                raise
        if self._host.writer is None:
            self._write_lock.release()
            return None
        return self._let_go()

    def _take_more(self, taken: Taken) -> Taken:
        """What ``taken`` holds and whatever was queued since: one write of the latest
        snapshot, every transition in order (the write lock held)."""
        with self._lock:
            more = self._unwritten
            if more is None:
                return taken
            self._unwritten = None
            return taken[0] + more, self._snapshot

    def _take_if_free(self) -> Taken | None:
        """The hot path's shortcut. Caller holds the state lock: if the write lock is free,
        take it (without waiting: never the wrong order) with the queue; else ``None``:
        the lock's holder writes the queue before it lets go."""
        if self._unwritten is None or not self._write_lock.acquire(False):
            return None
        pending, self._unwritten = self._unwritten, None
        return pending, self._snapshot

    def _write_taken(self, taken: Taken | None) -> None:
        """The worker's write of what ``_take_if_free`` took, after the state lock is let
        go: to the node's writer if it has one (the worker goes on at once), else here.
        ``None``: the write lock's holder writes the queue (without a writer, this waits
        for it, so the worker's write is in the store when it returns)."""
        writer = self._host.writer
        if taken is None:
            if writer is None:
                self._write()
        elif writer is None:
            self._write_held(taken)
        else:
            writer.put(self, taken)

    def _tell_token(self, status: S, tell: Callable[[], None]) -> None:
        """After a control call's write: signal the token only if the run is still in the
        ``status`` that call set (a racing call may have moved it on), so the token and
        the status never disagree."""
        with self._lock:
            if self._snapshot.status is status:
                tell()

    def _end(self) -> None:
        """Called once the terminal write was made, holding the write lock. No state lock:
        a waiter makes its event under that lock and then reads ``_finished``, so either
        it sees ``_finished`` or this sees its event."""
        if self._finished:
            return
        self._finished = True
        # A terminal run acknowledges no pause: the token lets go of the run (the one
        # reference cycle), so a run its caller lets go of is freed at once.
        self.token.detach()
        done = self._done
        if done is not None:
            done.set()
        self._host.ended(self)

    def _created(self, transition: Transition, *, appended: bool) -> None:
        """The store accepted ``create`` (and, if ``appended``, the creation transition)."""
        self._write_lock.acquire()  # a command may have reached the run already
        self._wt_written = self._snapshot.status_version
        with self._lock:
            self._history += trail_items(transition)
            if not appended:
                self._queue(transition)
            pending = self._unwritten
            if pending is None:  # as _let_go, without taking the state lock again
                self._write_lock.release()
                return
            self._unwritten = None
            snapshot = self._snapshot
        self._write_held((pending, snapshot))

    def _catch_up(self) -> bool:
        """Retry buffered writes; returns whether the store is up to date."""
        self._write()
        self._write_lock.acquire()
        try:
            with self._lock:
                snapshot = self._refreshed(self._snapshot)
            if self._wt_behind(snapshot):
                self._wt_flush(snapshot)
        except BaseException:
            self._write_lock.release()
            raise
        more = self._let_go()
        if more is not None:  # transitioned meanwhile
            self._write_held(more)
        return not self._wt_behind(self._snapshot)

    @property
    def desynced(self) -> bool:
        return self._wt_desynced

    @property
    def written(self) -> bool:
        """Whether the store has every transition this process made (or never will:
        desynced)."""
        return not self._wt_behind(self._snapshot)

    @property
    def snapshot_unrefreshed(self) -> TaskSnapshot:
        """The snapshot as last transitioned (no activity merged): what ``create`` stores."""
        return self._snapshot

    def _dependencies_met(self, reason: str) -> bool:
        """``pending -> queued`` for a pipeline node; ``False`` if it is no longer pending."""
        with self._lock:
            if self._snapshot.status is not S.PENDING:
                return False
            self._apply(S.QUEUED, reason=reason)
        self._write()
        return True

    @property
    def write_error(self) -> BaseException | None:
        """Why the latest write-through of this task failed (``None``: none has)."""
        return self._wt_error

    # -- control (any thread) ----------------------------------------------------------------

    def _check_words(self, reason: str | None, actor: str | None) -> None:
        """A reason and an actor go into the trail: refuse what the store cannot hold
        here, in the caller's thread, not on the write-through path."""
        rules = self._host.value_rules
        if reason is not None:
            check_text(reason, "reason", rules)
        if actor is not None:
            check_text(actor, "actor", rules)

    def _control_stop(self, kind: str, reason: str | None, actor: str | None) -> O:
        stop_kind: StopKind = "cancel" if kind == "cancel" else "stop"
        self._check_words(reason, actor)
        with self._lock:
            status = self._snapshot.status
            if status in states.TERMINAL:
                return O.ALREADY_TERMINAL
            if status is S.STOPPING:
                return O.ALREADY_STOPPING
            if status is S.STARTING:
                # Nothing to write: the carrier sees the request before calling the function.
                self.token.request_stop(stop_kind, reason)
                return O.STOPPING
            waiting = status in states.WAITING
            if waiting:
                self._apply(S.CANCELLED, reason=reason or f"{kind} before start", actor=actor)
            else:
                self._apply(S.STOPPING, reason=reason or f"{kind} requested", actor=actor)
        self._write()
        if waiting:
            return O.CANCELLED
        # The token hears it only once the transition is legal and in the store.
        self._tell_token(S.STOPPING, lambda: self.token.request_stop(stop_kind, reason))
        return O.STOPPING

    def stop(self, reason: str | None = None, actor: str | None = None) -> O:
        """Ask the task to stop at its next checkpoint; a waiting task is cancelled now."""
        return self._control_stop("stop", reason, actor)

    def cancel(self, reason: str | None = None, actor: str | None = None) -> O:
        """Cancel: a waiting task never runs; a running one stops and ends ``cancelled``."""
        return self._control_stop("cancel", reason, actor)

    def _cancel_waiting(self, failure: Failure) -> bool:
        """Cancel this run if it has not started (a pipeline's dependency ended badly)."""
        with self._lock:
            if self._snapshot.status not in states.WAITING:
                return False
            self._apply(S.CANCELLED, failure=failure, reason=failure.message)
        self._write()
        return True

    def pause(self, reason: str | None = None, actor: str | None = None) -> O:
        """Ask the task to pause; it acknowledges (``paused``) at its next checkpoint."""
        self._check_words(reason, actor)
        with self._lock:
            status = self._snapshot.status
            if status in states.TERMINAL:
                return O.ALREADY_TERMINAL
            if status in states.PAUSE_HELD:
                return O.ALREADY_PAUSED
            if status is S.STOPPING:
                return O.STOPPING
            if status is not S.RUNNING:
                self.token.request_pause()  # queued / starting: pauses as soon as it runs
                return O.PAUSE_PENDING
            self._apply(S.PAUSING, reason=reason or "pause requested", actor=actor)
        self._write()
        self._tell_token(S.PAUSING, self.token.request_pause)
        return O.PAUSING

    def resume(self, reason: str | None = None, actor: str | None = None) -> O:
        self._check_words(reason, actor)
        with self._lock:
            status = self._snapshot.status
            if status in states.TERMINAL:
                return O.ALREADY_TERMINAL
            if status is S.STOPPING:
                return O.STOPPING
            if status in states.PAUSE_HELD:
                if self._paused_at is not None and self._deadline is not None:
                    self._deadline += self._host.clock.monotonic() - self._paused_at
                self._paused_at = None
                self._apply(S.RUNNING, reason=reason or "resumed", actor=actor)
            elif self.token.pause_requested:
                self.token.resume()  # not started yet: nothing to write
                return O.RESUMED
            else:
                return O.NOT_PAUSED
        self._write()
        self._tell_token(S.RUNNING, self.token.resume)
        return O.RESUMED

    def _ack_pause(self) -> None:
        """Called by the token on the task thread: the task reached a checkpoint."""
        with self._lock:
            if self._snapshot.status is S.PAUSING:
                self._paused_at = self._host.clock.monotonic()
                self._apply(S.PAUSED, reason="acknowledged at a checkpoint")
        self._write()

    # -- supervision ---------------------------------------------------------------------------

    def _check_timeout(self, now: float) -> None:
        """Called by the supervisor loop. Paused time does not count against the timeout."""
        abandon = False
        with self._lock:
            status = self._snapshot.status
            if status in states.TERMINAL or status is S.PAUSED:
                return
            if self._grace_deadline is not None:
                if now < self._grace_deadline:
                    return
                self._abandon_after_timeout()
                abandon = True
            elif self._deadline is None or now < self._deadline or status not in states.STOPPABLE:
                return
            else:
                self._grace_deadline = now + self.definition.timeout_grace
                self._apply(S.STOPPING, reason=f"timeout after {self.definition.timeout}s")
        self._write()
        if abandon:
            self._host.abandon(self)
            return
        timeout = self.definition.timeout
        self._tell_token(
            S.STOPPING, lambda: self.token.request_stop("timeout", f"timed out after {timeout}s")
        )

    def _abandon_after_timeout(self) -> None:
        """Caller holds the lock."""
        timeout, grace = self.definition.timeout, self.definition.timeout_grace
        self.abandoned = True
        self._apply(
            S.FAILED,
            failure=Failure(
                kind=FailureKind.TIMEOUT,
                message=f"timed out after {timeout}s and did not stop within {grace}s; "
                "its thread may still be running (threads cannot be killed)",
                carrier_may_run=True,
            ),
            reason="timeout; carrier abandoned",
        )


# -- the node's side of a run ------------------------------------------------------------------
# The node's services drive a run through these functions (its own module reaches into it);
# task code never needs them, so the handle's public surface stays what users call.


# The hottest are the methods themselves (no wrapper frame): ``execute(run)`` is one
# attempt on the calling (worker) thread; ``stored(run, created, appended=...)`` tells the
# run the store accepted its ``create`` (and, if ``appended``, its trail row).
execute = TaskRun._execute
stored = TaskRun._created


def carrier_crashed(run: TaskRun, exc: BaseException) -> None:
    run._carrier_crashed(exc)


def catch_up(run: TaskRun) -> bool:
    """Retry the run's buffered writes; whether the store is up to date."""
    return run._catch_up()


def check_timeout(run: TaskRun, now: float) -> None:
    run._check_timeout(now)


def dependencies_met(run: TaskRun, reason: str) -> bool:
    return run._dependencies_met(reason)


def cancel_waiting(run: TaskRun, failure: Failure) -> bool:
    return run._cancel_waiting(failure)


def lease_due(run: TaskRun, mono: float) -> bool:
    """Whether the run's lease has used a third of its TTL (monotonic time)."""
    return run._lease_renew_at <= mono


def lease_renewed(run: TaskRun, next_due: float) -> None:
    run._lease_renew_at = next_due


def unflushed_activity(run: TaskRun) -> tuple[int, Progress | None, datetime | None] | None:
    """The token's activity if it changed since the last flush, else ``None``."""
    activity = run.token.activity()
    return None if activity[0] == run._flushed_activity else activity


def activity_flushed(run: TaskRun, seq: int) -> None:
    run._flushed_activity = seq
