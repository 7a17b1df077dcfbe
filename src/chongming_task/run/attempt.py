"""The carrier side of a ``TaskRun``: one attempt on a worker thread, from ``queued``
through the function's call to how it ended (a result, an exception, a stop).

``Carrier`` is a mixin of ``TaskRun`` (it holds no state of its own); ``RunHost`` is what
a run needs from its node.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import UTC
from typing import TYPE_CHECKING, Any, Protocol, cast

from .. import states
from ..clock import Clock
from ..errors import InvalidValue, StopRequested
from ..model import (
    TRAIL_WIDTH,
    Failure,
    FailureKind,
    TaskSnapshot,
    Trail,
    Transition,
    snapshot_changer,
    trusted_transition,
    utc,
)
from ..model import TaskStatus as S
from ..values import (
    ValueRules,
    describe_exception,
    describe_traceback,
    storable_result,
    storable_text,
)
from .writes import WriteThroughHost

if TYPE_CHECKING:
    from ..definitions import TaskDefinition
    from .handle import TaskRun
    from .token import CancellationToken
    from .writers import BehindWriter, Writer

__all__ = ["Carrier", "RunHost", "Taken"]

log = logging.getLogger("chongming_task.carrier")

# What a start and a success change, each changer made once, at import.
_started = snapshot_changer(("status", "status_version", "attempt", "started_at", "ended_at"))
_succeeded = snapshot_changer(("status", "status_version", "ended_at", "outcome", "failure"))

# queued -> starting -> running -> succeeded, the path most attempts take, asked of the
# table once.
states.check("(any task)", S.QUEUED, S.STARTING)
states.check("(any task)", S.STARTING, S.RUNNING)
states.check("(any task)", S.RUNNING, S.SUCCEEDED)

# The members that path names, as module globals. On Python 3.11 ``EnumType`` defines
# ``__getattr__``, so every ``S.RUNNING`` goes through the slow attribute hook: ~1,100
# instructions each, ten a task life (7 % of the in-memory life, counted by
# bench/runtime_instructions.py); a global is one specialised load.
_QUEUED, _STARTING, _RUNNING, _SUCCEEDED = S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED
# The same as text, for a run's history (a ``Trail``).
_QUEUED_TEXT, _STARTING_TEXT, _RUNNING_TEXT, _SUCCEEDED_TEXT = (
    _QUEUED.value,
    _STARTING.value,
    _RUNNING.value,
    _SUCCEEDED.value,
)


class RunHost(WriteThroughHost, Protocol):
    """What a run needs from its controller."""

    clock: Clock
    owner: str
    rng: random.Random
    writethrough_buffer: int
    value_rules: ValueRules
    writer: Writer | BehindWriter | None
    """Where the worker's own writes go on a store with group commit (``None``: the
    worker writes them itself)."""

    def ended(self, run: TaskRun) -> None: ...

    def requeue(self, run: TaskRun, delay: float) -> None: ...

    def abandon(self, run: TaskRun) -> None: ...


Taken = tuple[tuple[Transition, ...], TaskSnapshot]
"""What ``_take_if_free`` took: the transitions to write and the snapshot they lead to."""


class Carrier:
    """One attempt of a run on its worker thread (a mixin of ``TaskRun``)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what TaskRun provides
        _host: RunHost
        _lock: threading.RLock
        _snapshot: TaskSnapshot
        _history: Trail
        _args: tuple[Any, ...]
        _kwargs: dict[str, Any]
        _deadline: float | None
        _unwritten: tuple[Transition, ...] | None
        definition: TaskDefinition
        token: CancellationToken

        @property
        def task_id(self) -> str: ...

        def _apply(
            self, to: S, *, reason: str | None = None, actor: str | None = None, **changes: Any
        ) -> TaskSnapshot: ...

        def _write(self) -> None: ...

        def _take_if_free(self) -> Taken | None: ...

        def _write_taken(self, taken: Taken | None) -> None: ...

    def _execute(self) -> None:
        """One attempt, on the calling (worker) thread. The start is written before the
        function is called, or (with a ``Writer``) handed to the writer: the function
        runs while it is written; or (with a ``BehindWriter``) left queued: a quick
        task's end joins it, one write, and the writer writes it if the function runs
        on (``BehindWriter.watch``)."""
        host = self._host
        writer = host.writer
        joins = writer is not None and writer.joins_start
        with self._lock:
            if self._snapshot.status is not _QUEUED:
                return  # cancelled or stopped while it waited
            attempt = self._snapshot.attempt + 1
            self.token.attempt = attempt
            stopped = self.token.stop_requested
            if stopped:
                self._apply(S.STARTING, attempt=attempt, reason=f"attempt {attempt}")
                self._finish_stopped()
            else:
                self._start(attempt)
                if self.definition.timeout is not None:
                    self._deadline = host.clock.monotonic() + self.definition.timeout  # type: ignore[misc]  # a slot of TaskRun
                if self.token.pause_requested:
                    self._apply(S.PAUSING, reason="pause requested before start")
            joins = joins and not stopped
            taken = None if joins else self._take_if_free()
        if joins:
            cast("BehindWriter", writer).watch(cast("TaskRun", self))
        else:
            self._write_taken(taken)
        if stopped:
            return
        try:
            result = self.definition.func(self.token, *self._args, **self._kwargs)
        except StopRequested:
            with self._lock:
                if not self._snapshot.is_terminal:
                    self._finish_stopped()
            self._write()
        except Exception as exc:
            self._settle_failure(exc)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: record, then re-raise
            self._settle_failure(exc, retry=False)
            raise
        else:
            self._settle(result)

    def _start(self, attempt: int) -> None:
        """``queued -> starting -> running``: two transitions, one snapshot and one store
        write (the stored version jumps by two). Caller holds the lock and has checked
        that the run is ``queued``; nobody can observe the ``starting`` snapshot under the
        lock, so it is never built."""
        current = self._snapshot
        host = self._host
        # The one table decided this path once, at import; the caller checked ``queued``.
        now = host.clock.now()
        if now.tzinfo is not UTC:  # inline: SystemClock's reading is UTC already
            now = utc(now, "clock.now()")
        task_id, owner = current.task_id, host.owner
        version = current.status_version + 1
        reason = f"attempt {attempt}"
        starting = trusted_transition(
            task_id=task_id,
            version=version,
            from_status=_QUEUED,
            to_status=_STARTING,
            at=now,
            reason=reason,
            actor=owner,
        )
        running = trusted_transition(
            task_id=task_id,
            version=version + 1,
            from_status=_STARTING,
            to_status=_RUNNING,
            at=now,
            reason=None,
            actor=owner,
        )
        # No activity to merge: a retry's snapshot has its last attempt's already (the
        # transition back to queued merged it, and nothing reports while it waits).
        snapshot = _started(current, _RUNNING, version + 1, attempt, now, None)
        self._snapshot = snapshot  # type: ignore[misc]  # a slot of TaskRun
        # fmt: off
        self._history += (  # type: ignore[misc]  # a slot of TaskRun
            version, _QUEUED_TEXT, _STARTING_TEXT, now, reason, owner,
            version + 1, _STARTING_TEXT, _RUNNING_TEXT, now, None, owner,
        )
        # fmt: on
        unwritten = self._unwritten
        self._unwritten = (  # type: ignore[misc]  # a slot of TaskRun
            (starting, running) if unwritten is None else (*unwritten, starting, running)
        )

    def _settle(self, result: Any) -> None:
        """Record a return value. The store must be able to hold it: it keeps it as
        ``outcome``, and a value the write-through cannot write once left the store at
        ``running`` while the process said ``succeeded`` (distributed design §14.2). So it
        is checked against the store's rules *before* success, and any failure of that
        check (a value nested too deep, text that is not UTF-8, NaN) fails the task as
        ``result_invalid``, never retried. The outcome kept is the value as the store
        will give it back (JSON: tuples become lists, keys become strings), so this
        process and the store say the same thing."""
        with self._lock:
            # Abandoned after a timeout (terminal): this late result is not recorded.
            if self._snapshot.status not in states.TERMINAL:
                try:
                    outcome = (
                        None if result is None else storable_result(result, self._host.value_rules)
                    )
                except Exception as exc:  # InvalidValue, or anything the check itself hit
                    message = str(exc) if isinstance(exc, InvalidValue) else f"{exc!r}"
                    failure = Failure(
                        kind=FailureKind.RESULT_INVALID,
                        message=storable_text(message, self._host.value_rules),
                        exception_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    )
                    self._apply(S.FAILED, failure=failure, reason="result_invalid (not retried)")
                else:
                    self._succeed(outcome)
            taken = self._take_if_free()
        self._write_taken(taken)

    def _succeed(self, outcome: Any) -> None:
        """``running -> succeeded``: what ``_apply`` does for it, by the changer made at
        import (no keywords, no dict of changes, no lookup: 2.0 against 2.75 us with the
        lock). Caller holds the lock. A run that is not ``running`` (pausing, stopping)
        or that reported activity (merged by ``_apply``) takes ``_apply``."""
        current = self._snapshot
        if current.status is not _RUNNING or self.token.checkpointed:
            self._apply(S.SUCCEEDED, outcome=outcome, failure=None)
            return
        host = self._host
        now = host.clock.now()
        if now.tzinfo is not UTC:  # inline: SystemClock's reading is UTC already
            now = utc(now, "clock.now()")
        version, owner = current.status_version + 1, host.owner
        self._snapshot = _succeeded(current, _SUCCEEDED, version, now, outcome, None)  # type: ignore[misc]  # a slot of TaskRun
        ended = trusted_transition(
            task_id=current.task_id,
            version=version,
            from_status=_RUNNING,
            to_status=_SUCCEEDED,
            at=now,
            reason=None,
            actor=owner,
        )
        self._history += (version, _RUNNING_TEXT, _SUCCEEDED_TEXT, now, None, owner)  # type: ignore[misc]  # a slot of TaskRun
        unwritten = self._unwritten
        self._unwritten = (ended,) if unwritten is None else (*unwritten, ended)  # type: ignore[misc]  # a slot of TaskRun

    def _settle_failure(self, exc: BaseException, *, retry: bool = True) -> None:
        delay = self._record_failure(exc, retry)
        self._write()
        if delay is not None:
            self._host.requeue(cast("TaskRun", self), delay)

    def _record_failure(self, exc: BaseException, retry: bool) -> float | None:
        """Record a failure: back to ``queued`` for a retry (returns its delay) or
        ``failed`` (returns ``None``)."""
        with self._lock:
            current = self._snapshot
            if current.is_terminal:
                return None
            failure = Failure(
                kind=FailureKind.EXCEPTION,
                message=storable_text(describe_exception(exc), self._host.value_rules),
                exception_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback=describe_traceback(exc, self._host.value_rules),
            )
            policy = self.definition.retry
            if retry and current.status is not S.STOPPING and current.attempt <= policy.retries:
                delay = policy.delay(current.attempt, self._host.rng)
                self._deadline = None  # type: ignore[misc]  # a slot of TaskRun
                self._apply(
                    S.QUEUED,
                    failure=failure,
                    reason=f"retry {current.attempt}/{policy.retries} in {delay:.3g}s after "
                    f"{failure.message}",
                )
                return delay
            self._apply(S.FAILED, failure=failure, reason=failure.message)
            return None

    def _finish_stopped(self) -> None:
        """The task obeyed a stop/cancel/timeout request. Caller holds the lock."""
        kind = self.token.stop_kind
        if self._snapshot.status in states.STOPPABLE:
            self._apply(S.STOPPING, reason="stop raised in the task")
        # What it was doing when asked: the status the move into stopping left.
        last = self._history[-TRAIL_WIDTH:]  # version, from, to, ...: the last transition
        was = S(last[1]) if last and last[2] == S.STOPPING.value and last[1] else S.RUNNING
        if kind == "timeout":
            timeout = self.definition.timeout
            self._apply(
                S.FAILED,
                failure=Failure(
                    kind=FailureKind.TIMEOUT,
                    message=f"timed out after {timeout}s (the task stopped at a checkpoint)",
                ),
                reason="timeout",
            )
        elif kind == "cancel":
            self._apply(S.CANCELLED, reason=f"cancelled while {was.value}")
        else:
            self._apply(S.STOPPED, reason="stopped at a checkpoint")

    def _carrier_crashed(self, exc: BaseException) -> None:
        """Last resort, when the runtime itself failed while carrying this task: end the
        task ``failed`` (``cancelled`` if it never started) rather than leave it active in
        memory and store with nobody to finish it."""
        self._record_crash(exc)
        self._write()

    def _record_crash(self, exc: BaseException) -> None:
        with self._lock:
            if self._snapshot.is_terminal:
                return
            failure = Failure(
                kind=FailureKind.EXCEPTION,
                message=storable_text(
                    f"the runtime failed while carrying this task: {describe_exception(exc)}",
                    self._host.value_rules,
                ),
                exception_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            )
            try:
                if self._snapshot.status in states.WAITING:
                    self._apply(S.CANCELLED, failure=failure, reason="carrier crashed")
                    return
                if not states.is_legal(self._snapshot.status, S.FAILED):
                    self._apply(S.STOPPING, reason="carrier crashed")
                self._apply(S.FAILED, failure=failure, reason="carrier crashed")
            except Exception:
                log.exception("task %s: could not record the carrier's crash", self.task_id)
