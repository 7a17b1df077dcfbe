"""``Run``: one task's life in the process that holds it, and the handle ``submit``
returns.

Every status change goes through ``_apply``: ``states`` checks it against the one table,
the snapshot is replaced and a ``Transition`` made and queued under the run's state lock;
the run's ``RunWrites`` then brings it to the store, holding only the write lock.
Control calls (stop, pause, resume, cancel) arrive from any thread; the token hears them
once their transition is in the store, and the task at its next ``checkpoint``. What an
attempt's ending becomes is decided in ``attempt``.

The methods under "the node's side" are how the node's services drive a run (a worker
executes it, the supervisor checks its timeout and catches its writes up); task code
never needs them.
"""

from __future__ import annotations

import logging
import threading
from _thread import RLock as _RLock
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from .. import states
from ..errors import (
    CarrierTerminated,
    Retry,
    StopRequested,
    TaskDesynced,
    TaskUnsuccessful,
    WaitTimeout,
)
from ..limits import MAX_ACTOR, MAX_REASON
from ..model import ControlOutcome as O
from ..model import (
    Failure,
    JSONValue,
    Progress,
    TaskSnapshot,
    Transition,
)
from ..model import TaskStatus as S
from ..trail import TRAIL_WIDTH, trail_transitions
from ..values import check_text, storable_text
from . import attempt
from .host import RunGroup, RunHost
from .token import CancellationToken, RunSignals, StopKind
from .writes import RunWrites

if TYPE_CHECKING:
    from ..definitions import TaskDefinition

__all__ = ["Run", "RunGroup", "RunHost"]

log = logging.getLogger("chongming_task.run")

CANCEL_WAIT = 1.0
"""Seconds a coroutine cancelled after its stop's grace has to end (its ``finally``
blocks, which may await); one still running then refused its cancellation and is
abandoned: ended as the stop asked, ``carrier_may_run``."""

# The statuses an attempt's hot path names, as module globals (the reason: ``writes``).
_QUEUED, _RUNNING, _SUCCEEDED = S.QUEUED, S.RUNNING, S.SUCCEEDED


class Run:
    """A task this node holds: its state, its writes, its signals, and what the node's
    services drive (an attempt, a timeout, a lease)."""

    # Slots: a node holds many runs, and an instance dict is one more object for the
    # cyclic garbage collector to walk on every full collection.
    __slots__ = (
        "_args",
        "_asked_again",
        "_deadline",
        "_done",
        "_finished",
        "_flushed_activity",
        "_grace_deadline",
        "_held",
        "_host",
        "_kwargs",
        "_lease_renew_at",
        "_lock",
        "_pause_deadline",
        "_paused_at",
        "_suspended",
        "abandoned",
        "cancel_asked",
        "definition",
        "node_key",
        "pipeline",
        "signals",
        "task_id",
        "writes",
    )

    def __init__(
        self,
        host: RunHost,
        definition: TaskDefinition,
        snapshot: TaskSnapshot,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        created: Transition,
    ) -> None:
        """``created`` is the transition that creates the task (the first of its
        history); the node stores it with ``snapshot``, then calls ``stored``."""
        self._host = host
        self.task_id: Final[str] = snapshot.task_id  # an attribute: read on every hot path
        self.definition = definition
        self._args = args
        self._kwargs = kwargs
        # The state lock guards the snapshot and the queue of unwritten transitions; the
        # token shares it (checkpoint() takes it), and so do the run's writes.
        self._lock = _RLock()  # threading.RLock() is a Python function around it
        self.writes = RunWrites(host, snapshot, created, lock=self._lock, on_end=self._end)
        """How this run's transitions reach the store (the node's writers use it)."""
        self._finished = False
        self._done: threading.Event | None = None  # made by the first waiter: runs are many
        self.signals = RunSignals(
            snapshot.task_id,
            host.clock,
            on_pause_ack=self._ack_pause,
            lock=self._lock,
            rules=host.value_rules,
        )
        if definition.is_async:
            self.signals.make_async()
        self.abandoned = False
        self.cancel_asked = False
        self._asked_again = 0  # attempts that ended in a Retry: no failure counted
        """An async attempt's cancellation was asked (a stop's grace ran out, a timeout)."""
        self.pipeline: RunGroup | None = None  # set for pipeline nodes
        self.node_key: str | None = None
        self._deadline: float | None = None
        self._grace_deadline: float | None = None
        self._held = False  # a pause holds it before its start, as the store says
        self._paused_at: float | None = None
        self._pause_deadline: float | None = None  # a pause's grace, where it may suspend
        self._suspended = False  # its worker process is stopped (SIGSTOP) by a pause
        self._flushed_activity = 0
        self._lease_renew_at = 0.0  # monotonic time when the node renews the lease

    def __repr__(self) -> str:
        s = self.writes.snapshot
        return f"<Run {s.task_id} {s.name} {s.status.value} v{s.status_version}>"

    # -- the handle ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.writes.snapshot.name

    @property
    def status(self) -> S:
        return self.writes.snapshot.status

    @property
    def bucket(self) -> int | None:
        return self.writes.snapshot.bucket

    @property
    def priority(self) -> int:
        """Its place in the node's queue: higher first (fixed at submit)."""
        return self.writes.snapshot.priority

    @property
    def concurrency_key(self) -> str | None:
        """What its definition's ``max_per_key`` counts (fixed at submit)."""
        return self.writes.snapshot.concurrency_key

    def snapshot(self) -> TaskSnapshot:
        """This process's view of the task, with the latest progress and heartbeat."""
        with self._lock:
            return self._refreshed(self.writes.snapshot)

    def history(self) -> list[Transition]:
        """Every transition this process made, in order (the store's trail may be behind)."""
        with self._lock:
            trail = self.writes.trail
        return trail_transitions(self.task_id, trail)

    def done(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None = None) -> TaskSnapshot:
        """Block until the task is terminal; return its final snapshot: what the store
        holds (a desynced run's store may hold ``lost`` while it ended otherwise here:
        ``result()`` says both).

        Raises ``WaitTimeout`` if it is not terminal within ``timeout`` seconds.
        """
        if self._finished:
            return self._final()
        with self._lock:
            if self._done is None:
                self._done = threading.Event()
                if self._finished:
                    self._done.set()
            done = self._done
        if not done.wait(timeout):
            raise WaitTimeout(f"task {self.task_id} still {self.status.value} after {timeout}s")
        return self._final()

    def _final(self) -> TaskSnapshot:
        """The ended run's snapshot, or what the store holds instead once desynced."""
        if self.writes.desynced and self.writes.stored_instead is not None:
            return self.writes.stored_instead
        return self.snapshot()

    def result(self, timeout: float | None = None) -> JSONValue:
        """The task's return value; raises ``TaskUnsuccessful`` if it did not succeed,
        ``TaskDesynced`` (one) if the store ended it without this process, whatever it
        came to here."""
        final = self.wait(timeout)
        if self.writes.desynced:
            raise TaskDesynced(final, self.snapshot())
        if final.status is not S.SUCCEEDED:
            raise TaskUnsuccessful(final)
        return final.outcome

    @property
    def desynced(self) -> bool:
        """Another writer changed the task in the store: its writes stopped."""
        return self.writes.desynced

    @property
    def written(self) -> bool:
        """Whether the store has every transition this process made (or never will:
        desynced)."""
        return not self.writes.behind

    @property
    def write_error(self) -> BaseException | None:
        """Why the latest write of this task failed (``None``: none has)."""
        return self.writes.error

    # -- the one path every transition takes --------------------------------------------------

    def _activity(self) -> dict[str, Any]:
        """The token's heartbeat and progress (which the supervisor writes via ``touch``)
        as snapshot changes, so a write of the snapshot never writes them back older."""
        if not self.signals.checkpointed:
            return {}
        _, progress, heartbeat = self.signals.activity()
        changes: dict[str, Any] = {}
        if progress is not None:
            changes["progress"] = progress
        if heartbeat is not None:
            changes["last_heartbeat_at"] = heartbeat
        return changes

    def _refreshed(self, snapshot: TaskSnapshot) -> TaskSnapshot:
        if snapshot.is_terminal:  # its end carried its last activity; nothing is newer
            return snapshot
        changes = self._activity()
        return snapshot.evolve(**changes) if changes else snapshot

    def _apply(
        self, to: S, *, reason: str | None = None, actor: str | None = None, **changes: Any
    ) -> TaskSnapshot:
        """Make one transition, holding the state lock (the run's writes check it
        against the one table and queue it); the caller has them write it once it lets
        go of the lock. The token's activity joins the snapshot, so a write of it never
        writes progress and heartbeat back older."""
        with self._lock:
            if self.signals.checkpointed:
                changes = {**self._activity(), **changes}
            return self.writes.move(((to, reason),), actor, changes)

    def _end(self) -> None:
        """Called by the run's writes once its terminal write was made, holding the
        write lock. No state lock: a waiter makes its event under that lock and then
        reads ``_finished``, so either it sees ``_finished`` or this sees its event."""
        self._finished = True
        if self._held:  # ended while a pause held it (cancelled, say)
            self._held = False
            self._mark_hold(False)
        # A terminal run acknowledges no pause: the token lets go of the run (the one
        # reference cycle), so a run its caller lets go of is freed at once.
        self.signals.detach()
        done = self._done
        if done is not None:
            done.set()
        self._host.ended(self)

    # -- control (any thread) ----------------------------------------------------------------

    def _check_words(self, reason: str | None, actor: str | None) -> None:
        """A reason and an actor go into the trail: refuse what the store cannot hold
        here, in the caller's thread, not on the write path."""
        rules = self._host.value_rules
        if reason is not None:
            check_text(reason, "reason", rules, MAX_REASON)
        if actor is not None:
            check_text(actor, "actor", rules, MAX_ACTOR)

    def _tell_token(self, status: S, tell: Callable[[], None]) -> None:
        """After a control call's write: signal the token only if the run is still in the
        ``status`` that call set (a racing call may have moved it on), so the token and
        the status never disagree."""
        with self._lock:
            if self.writes.snapshot.status is status:
                tell()

    def _control_stop(self, kind: StopKind, reason: str | None, actor: str | None) -> O:
        self._check_words(reason, actor)
        with self._lock:
            status = self.writes.snapshot.status
            if status.is_terminal:
                return O.ALREADY_TERMINAL
            if status is S.STOPPING:
                return O.ALREADY_STOPPING
            if status is S.STARTING:
                # Nothing to write: the attempt sees the request before calling the function.
                self.signals.request_stop(kind, reason)
                return O.STOPPING
            waiting = status in states.WAITING
            if waiting:
                self._apply(S.CANCELLED, reason=reason or f"{kind} before start", actor=actor)
            else:
                self._apply(S.STOPPING, reason=reason or f"{kind} requested", actor=actor)
        self.writes.write()
        if waiting:
            return O.CANCELLED
        # The token hears it only once the transition is legal and in the store.
        self._tell_token(S.STOPPING, lambda: self.signals.request_stop(kind, reason))
        if self.definition.is_async:  # asked first; cancelled once its grace runs out
            grace = self.definition.timeout_grace
            self._host.cancel_async(self, after=grace)
            with self._lock:  # a coroutine that refuses its cancellation is abandoned
                if self._grace_deadline is None:
                    self._grace_deadline = self._host.clock.monotonic() + grace + CANCEL_WAIT
        elif self.definition.carrier == "process":  # its worker is ended once grace is out
            with self._lock:
                suspended, self._suspended = self._suspended, False
                self._pause_deadline = None
                if self._grace_deadline is None:
                    grace = self.definition.timeout_grace
                    self._grace_deadline = self._host.clock.monotonic() + grace
            if suspended:  # a stopped process reaches no checkpoint: ended at once
                self._host.terminate(self)
        return O.STOPPING

    def stop(self, reason: str | None = None, actor: str | None = None) -> O:
        """Ask the task to stop at its next checkpoint; a waiting task is cancelled now."""
        return self._control_stop("stop", reason, actor)

    def cancel(self, reason: str | None = None, actor: str | None = None) -> O:
        """Cancel: a waiting task never runs; a running one stops and ends ``cancelled``."""
        return self._control_stop("cancel", reason, actor)

    def pause(self, reason: str | None = None, actor: str | None = None) -> O:
        """Ask the task to pause; it acknowledges (``paused``) at its next checkpoint. A
        task that has not started is held until resumed, and the store says so (its
        ``holds``: docs/design.md, "A pause before the start")."""
        self._check_words(reason, actor)
        with self._lock:
            status = self.writes.snapshot.status
            if status.is_terminal:
                return O.ALREADY_TERMINAL
            if status in states.PAUSE_HELD:
                return O.ALREADY_PAUSED
            if status is S.STOPPING:
                return O.STOPPING
            if status is not S.RUNNING:
                self.signals.request_pause()  # queued / starting: pauses as soon as it runs
                hold = status in states.WAITING and not self._held
                self._held = self._held or hold
            else:
                hold = False
                self._apply(S.PAUSING, reason=reason or "pause requested", actor=actor)
                self._arm_suspension()
        if status is not S.RUNNING:
            if hold:  # every process can see that it waits for a resume
                self._mark_hold(True)
            return O.PAUSE_PENDING
        self.writes.write()
        self._tell_token(S.PAUSING, self.signals.request_pause)
        return O.PAUSING

    def _mark_hold(self, held: bool) -> None:
        """Keep (or forget) in the store that a pause holds this task before its start.
        A store fault costs the task nothing: it only goes unseen by other processes."""
        caps = self._host.capabilities
        try:
            if held:
                caps.hold_task(self.task_id, since=self._host.clock.now(), by=self._host.owner)
            else:
                caps.release_hold(self.task_id)
        except Exception as exc:
            log.warning(
                "task %s: the store could not %s its hold by a pause: %s",
                self.task_id,
                "keep" if held else "forget",
                exc,
            )

    def resume(self, reason: str | None = None, actor: str | None = None) -> O:
        self._check_words(reason, actor)
        with self._lock:
            status = self.writes.snapshot.status
            if status.is_terminal:
                return O.ALREADY_TERMINAL
            if status is S.STOPPING:
                return O.STOPPING
            held = False
            suspended = self._suspended
            if status in states.PAUSE_HELD:
                if self._paused_at is not None and self._deadline is not None:
                    self._deadline += self._host.clock.monotonic() - self._paused_at
                self._paused_at = None
                self._pause_deadline = None
                self._suspended = False
                self._apply(S.RUNNING, reason=reason or "resumed", actor=actor)
            elif self.signals.pause_requested:
                self.signals.resume()  # not started yet: no transition to write
                held, self._held = self._held, False
            else:
                return O.NOT_PAUSED
        if status not in states.PAUSE_HELD:
            if held:
                self._mark_hold(False)
            return O.RESUMED
        self.writes.write()
        if suspended:  # its worker process continues where it stood (SIGCONT)
            self._host.carry_on(self)
        self._tell_token(S.RUNNING, self.signals.resume)
        return O.RESUMED

    def _ack_pause(self) -> None:
        """Called by the token on the task thread: the task reached a checkpoint."""
        with self._lock:
            if self.writes.snapshot.status is S.PAUSING:
                self._paused_at = self._host.clock.monotonic()
                self._apply(S.PAUSED, reason="acknowledged at a checkpoint")
        self.writes.write(soon=self.definition.is_async)

    # -- the node's side: one attempt (``node.workers.attempt``, ``node.aio.attempt``) ------------

    def begin_attempt(self) -> bool:
        """Start an attempt; whether to call the function. The start is written before
        the function is called, or handed to the node's writer (the function runs while
        it is written), or left queued to join a quick task's end in one write (a
        writer that ``joins_start``)."""
        writer = self._host.writer
        joins = writer is not None and writer.joins_start
        held = False
        with self._lock:
            if self.writes.snapshot.status is not _QUEUED:
                return False  # cancelled or stopped while it waited
            attempt_no = self.writes.snapshot.attempt + 1
            self.signals.attempt = attempt_no
            stopped = self.signals.stop_requested
            reason = f"attempt {attempt_no}"
            if stopped:
                self._apply(S.STARTING, reason=reason, attempt=attempt_no)
                self._finish_stopped()
            else:
                self.writes.start(attempt_no, reason)
                if self.definition.timeout is not None:
                    self._deadline = self._host.clock.monotonic() + self.definition.timeout
                if self.signals.pause_requested:
                    self._apply(S.PAUSING, reason="pause requested before start")
                    held, self._held = self._held, False  # its status says it now
                    self._arm_suspension()
            joins = joins and not stopped
            taken = None if joins else self.writes.take_if_free()
        if held:
            self._mark_hold(False)
        if joins and writer is not None:
            writer.watch(self.writes)
        else:
            self.writes.hand_off(taken)
        return not stopped

    @property
    def arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """What the function is called with after its token: ``(args, kwargs)``."""
        return self._args, self._kwargs

    def call(self) -> Any:
        """The task's function called with its arguments (an ``async def`` one gives its
        coroutine, for the node's event loop to await)."""
        return self.definition.func(CancellationToken(self.signals), *self._args, **self._kwargs)

    def ended_by(self, exc: BaseException, *, soon: bool = False) -> None:
        """Record what the function raised: a stop obeyed, an exception (retried by the
        policy), a ``BaseException`` (never retried). ``soon``: handed to the writer."""
        if isinstance(exc, Retry):
            self._again(exc, soon=soon)
        elif isinstance(exc, StopRequested):
            with self._lock:
                if not self.writes.snapshot.is_terminal:
                    self._finish_stopped(str(exc) if isinstance(exc, CarrierTerminated) else None)
            self.writes.write(soon=soon)
        else:
            self._failed(exc, retry=isinstance(exc, Exception), soon=soon)

    def settle(self, result: Any) -> None:
        """Record a return value (``attempt.result_outcome``: checked against what the
        store can hold before it is a success)."""
        with self._lock:
            status = self.writes.snapshot.status
            # Abandoned after a timeout (terminal): this late result is not recorded.
            if status not in states.TERMINAL:
                outcome, invalid = (
                    (None, None)
                    if result is None
                    else attempt.result_outcome(result, self._host.value_rules)
                )
                if invalid is not None:
                    self._apply(S.FAILED, failure=invalid, reason="result_invalid (not retried)")
                elif status is _RUNNING and not self.signals.checkpointed:
                    self.writes.succeed(outcome)
                else:
                    done = _complete(self.signals.progress)
                    self._apply(_SUCCEEDED, outcome=outcome, failure=None, **done)
            taken = self.writes.take_if_free()
        self.writes.hand_off(taken)

    def _failed(self, exc: BaseException, *, retry: bool, soon: bool = False) -> None:
        """Record an exception: back to ``queued`` for a retry after its backoff, or
        ``failed``."""
        delay: float | None = None
        with self._lock:
            current = self.writes.snapshot
            if not current.is_terminal:
                failure = attempt.exception_failure(exc, self._host.value_rules)
                if current.status is S.PAUSED:
                    # Its worker died while suspended by the pause: it can neither run on
                    # nor be retried from a pause, so it ends, saying so.
                    self._apply(S.STOPPING, reason="its carrier ended while it was paused")
                    current = self.writes.snapshot
                policy = self.definition.retry
                failures = current.attempt - self._asked_again  # a Retry asked counts none
                retry = retry and current.status is not S.STOPPING and failures <= policy.retries
                why = None
                if retry and not policy.retries_on(exc):
                    retry, why = False, policy.why_not(exc)
                if retry:
                    delay = policy.delay(failures, self._host.rng)
                    self._deadline = None
                    self._apply(
                        S.QUEUED,
                        failure=failure,
                        reason=f"retry {failures}/{policy.retries} in {delay:.3g}s "
                        f"after {failure.message}",
                    )
                else:
                    reason = failure.message if why is None else f"{failure.message} ({why})"
                    self._apply(S.FAILED, failure=failure, reason=reason)
        self.writes.write(soon=soon)
        if delay is not None:
            self._host.requeue(self, delay)

    def _again(self, asked: Retry, *, soon: bool) -> None:
        """The task raised ``Retry``: back to ``queued`` to run again ``asked.after``
        seconds from now, no failure counted (a stop asked meanwhile wins)."""
        delay: float | None = None
        with self._lock:
            current = self.writes.snapshot
            if not current.is_terminal:
                if current.status is S.STOPPING:
                    self._finish_stopped()
                else:
                    self._asked_again += 1
                    self._deadline = None
                    delay = asked.after
                    said = storable_text(str(asked), self._host.value_rules, limit=MAX_REASON)
                    self._apply(S.QUEUED, failure=None, reason=said)
        self.writes.write(soon=soon)
        if delay is not None:
            self._host.requeue(self, delay)

    def _finish_stopped(self, forced: str | None = None) -> None:
        """The task obeyed a stop, cancel or timeout request, or was ended by force
        (``forced`` says how). Caller holds the lock."""
        if self.writes.snapshot.status in states.STOPPABLE:
            self._apply(S.STOPPING, reason="stop raised in the task")
        # What it was doing when asked: the status the move into stopping left.
        last = self.writes.trail[-TRAIL_WIDTH:]  # version, from, to, at, reason, actor
        was = S(last[1]) if last and last[2] == S.STOPPING.value and last[1] else S.RUNNING
        if forced is not None:
            how = forced
        else:
            how = attempt.AT_AN_AWAIT if self.cancel_asked else attempt.AT_A_CHECKPOINT
        to, failure, reason = attempt.stopped_end(
            self.signals.stop_kind, was, self.definition.timeout, how
        )
        if failure is None:
            self._apply(to, reason=reason)
        else:
            self._apply(to, failure=failure, reason=reason)

    def crashed(self, exc: BaseException) -> None:
        """Last resort, when the runtime itself failed while carrying this task: end the
        task ``failed`` (``cancelled`` if it never started) rather than leave it active
        in memory and store with nobody to finish it."""
        with self._lock:
            status = self.writes.snapshot.status
            if not status.is_terminal:
                failure = attempt.crash_failure(exc, self._host.value_rules)
                try:
                    if status in states.WAITING:
                        self._apply(S.CANCELLED, failure=failure, reason="carrier crashed")
                    else:
                        if not states.is_legal(status, S.FAILED):
                            self._apply(S.STOPPING, reason="carrier crashed")
                        self._apply(S.FAILED, failure=failure, reason="carrier crashed")
                except Exception:
                    log.exception("task %s: could not record the carrier's crash", self.task_id)
        self.writes.write()

    # -- the node's side: submission, pipelines, supervision --------------------------------------

    def stored(self, created: Transition, *, appended: bool) -> None:
        """The store accepted this run's ``create`` (and, if ``appended``, its creation
        transition ``created``)."""
        self.writes.stored(created, appended=appended)

    def dependencies_met(self, reason: str) -> bool:
        """``pending -> queued`` for a pipeline node; ``False`` if it is no longer pending."""
        with self._lock:
            if self.writes.snapshot.status is not S.PENDING:
                return False
            self._apply(S.QUEUED, reason=reason)
        self.writes.write()
        return True

    def cancel_waiting(self, failure: Failure) -> bool:
        """Cancel this run if it has not started (a pipeline's dependency ended badly)."""
        with self._lock:
            if self.writes.snapshot.status not in states.WAITING:
                return False
            self._apply(S.CANCELLED, failure=failure, reason=failure.message)
        self.writes.write()
        return True

    def catch_up(self) -> bool:
        """Retry the run's buffered writes; whether the store is up to date."""
        return self.writes.catch_up(self._refreshed)

    def check_timeout(self, now: float) -> bool:
        """The supervisor's timeout check at monotonic ``now``. Paused time does not
        count against the timeout; a task that ignores its stop for the grace period is
        abandoned ``failed``, its thread perhaps still running, and so is a coroutine
        that refused its stop's cancellation (ended as the stop asked). Returns whether
        it did either."""
        abandon = False
        with self._lock:
            status = self.writes.snapshot.status
            if status.is_terminal or status is S.PAUSED:
                return False
            pause_due = self._pause_deadline
            if status is S.PAUSING and pause_due is not None and now >= pause_due:
                self._pause_deadline = None
                suspend = True
            else:
                suspend = False
        if suspend:
            return self._suspend()
        with self._lock:
            status = self.writes.snapshot.status
            if status.is_terminal or status is S.PAUSED:
                return False
            if self._grace_deadline is not None:
                if now < self._grace_deadline:
                    return False
                if self.definition.carrier == "process":
                    # Its worker process can really be ended: terminated, then the
                    # attempt ends as its stop asked, on its carrier's thread (asked
                    # again each second until a worker process carries it).
                    self._grace_deadline = now + 1.0
                    terminate = True
                else:
                    self._abandon(self.definition.timeout_grace)
                    abandon = True
                    terminate = False
            elif self._deadline is None or now < self._deadline or status not in states.STOPPABLE:
                return False
            else:
                terminate = False
                self._grace_deadline = now + self.definition.timeout_grace
                self._apply(S.STOPPING, reason=f"timeout after {self.definition.timeout}s")
        if terminate:
            return self._host.terminate(self)
        self.writes.write()
        if abandon:
            self._host.abandon(self)
            return True
        timeout = self.definition.timeout
        self._tell_token(
            S.STOPPING, lambda: self.signals.request_stop("timeout", f"timed out after {timeout}s")
        )
        if self.definition.is_async:  # a coroutine can really be cancelled: at once
            self._host.cancel_async(self, after=0.0)
        return True

    def _arm_suspension(self) -> None:
        """A pause was just asked: a task that may be suspended is, if it reaches no
        checkpoint within its grace (``check_timeout``). Caller holds the lock."""
        if self.definition.suspend:
            grace = self.definition.timeout_grace
            self._pause_deadline = self._host.clock.monotonic() + grace

    def _suspend(self) -> bool:
        """A pause of a process task that reached no checkpoint within its grace: its
        worker process is stopped where it stands (SIGSTOP), and the task is paused."""
        pid = self._host.suspend(self)
        if pid is None:
            # No worker process carries it yet (one is being started): asked again at
            # the next check, while the pause stands.
            with self._lock:
                if self.writes.snapshot.status is S.PAUSING and self._pause_deadline is None:
                    self._pause_deadline = self._host.clock.monotonic()
            return False
        with self._lock:
            self._suspended = True
            if self.writes.snapshot.status is S.PAUSING:
                self._paused_at = self._host.clock.monotonic()
                self._apply(S.PAUSED, reason=f"suspended: its worker process {pid} stopped")
        self.writes.write()
        return True

    def _abandon(self, waited: float) -> None:
        """End the task as its stop or timeout asked although its carrier has not
        ended: it may still run (``carrier_may_run``). Caller holds the lock."""
        self.abandoned = True
        kind = self.signals.stop_kind
        is_async = self.definition.is_async
        if kind == "timeout":
            failure = attempt.abandoned_after_timeout(
                self.definition.timeout, waited, is_async=is_async
            )
            self._apply(S.FAILED, failure=failure, reason="timeout; carrier abandoned")
        else:
            to, failure, reason = attempt.abandoned_after_stop(kind, waited, is_async=is_async)
            self._apply(to, failure=failure, reason=reason)

    def left_at_close(self, waited: float) -> bool:
        """The node's close waited ``waited`` seconds for this coroutine, stopped and
        cancelled, and it has not ended: end it as its stop asked, saying it may still
        run. Thread tasks keep their status (``close``). Whether it ended it."""
        if not self.definition.is_async:
            return False
        with self._lock:
            if self.writes.snapshot.status is not S.STOPPING:
                return False
            self._abandon(waited)
        self.writes.write()
        self._host.abandon(self)
        return True

    def lease_due(self, mono: float) -> bool:
        """Whether the run's lease has used a third of its TTL (monotonic time)."""
        return self._lease_renew_at <= mono

    def lease_renewed(self, next_due: float) -> None:
        self._lease_renew_at = next_due

    def unflushed_activity(self) -> tuple[int, Progress | None, datetime | None] | None:
        """The token's activity if it changed since the last flush, else ``None``."""
        activity = self.signals.activity()
        return None if activity[0] == self._flushed_activity else activity

    def activity_flushed(self, seq: int) -> None:
        self._flushed_activity = seq


def _complete(progress: Progress | None) -> dict[str, Any]:
    """A success's progress: the last one reported, said complete (``current`` at its
    ``total``; an open-ended one's total is where it got to), so a task that last
    checkpointed at 19 of 20 does not read 19 of 20 once it has succeeded."""
    if progress is None:
        return {}
    total = progress.current if progress.total is None else progress.total
    if progress.current == total and progress.total is not None:
        return {}
    return {"progress": Progress(current=total, total=total, message=progress.message)}
