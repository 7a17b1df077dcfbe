"""OpenTelemetry for every task's life (the ``[otel]`` extra; docs/observability.md).

``ChongmingTaskInstrumentor().instrument(tracer_provider=..., meter_provider=...)``
installs a watcher on the run path (``_observe``); ``uninstrument()`` removes it. Then:

- a ``submit`` span (``PRODUCER``) is made in the caller's context around each submit,
  ``submit_many`` and pipeline submit, and every task it makes stores that span's W3C
  trace context (``TaskSnapshot.trace_context``);
- each attempt runs inside a ``run`` span (``CONSUMER``), a child of the stored context
  (retries are sibling spans; a pipeline's tasks share its submit's trace);
  the span ends with the attempt, with an event for each pause, resume, stop, cancel,
  timeout and retry it saw (who asked and why), and status ``ERROR`` with the exception
  recorded when the attempt failed;
- a schedule's firing starts a trace of its own (``fire``);
- a control sent through a store (the CLI, the dashboard) is a ``PRODUCER`` span linked
  to the task's trace;
- the meter gets run durations, queue waits, running tasks, transitions and failures;
- every log record made while a task runs carries ``trace_id`` and ``span_id``.

Span and metric names follow the messaging semantic conventions where they fit
(``messaging.operation.type`` ``send`` / ``process``, ``messaging.message.id``); the rest
is ``chongming.*``. A fault of the instrumentation is logged and costs the task nothing.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import Token
from datetime import datetime
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation, get_meter
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        Tracer,
        TraceState,
    )
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:  # pragma: no cover - what a user without the extra sees
    raise ImportError(
        'chongming_task.otel needs the [otel] extra: pip install "chongming-task[otel]"'
    ) from missing

from . import observe
from .current import install_log_context
from .limits import MAX_TRACE_CONTEXT
from .model import CommandAction, ControlReceipt, FailureKind, TaskSnapshot, TaskStatus
from .pipelines import PipelineRun
from .trail import TRAIL_WIDTH

if TYPE_CHECKING:
    from .run.life import Run

__all__ = ["ChongmingTaskInstrumentor"]

log = logging.getLogger("chongming_task.otel")

_SCOPE = "chongming_task"
_SYSTEM = "chongming_task"
_W3C = TraceContextTextMapPropagator()
_MAX_STATE = MAX_TRACE_CONTEXT
"""A ``tracestate`` longer than this is not stored (W3C asks vendors to keep it to 512
characters when they cut it); the ``traceparent`` always is."""

_TERMINAL = {s.value for s in TaskStatus if s.is_terminal}
_STARTING, _RUNNING = TaskStatus.STARTING.value, TaskStatus.RUNNING.value
_EVENTS = {
    TaskStatus.PAUSING.value: "pause",
    TaskStatus.PAUSED.value: "paused",
    TaskStatus.RUNNING.value: "resume",
    TaskStatus.QUEUED.value: "retry",
}
"""The event a transition during an attempt makes, by the status it moved to (a move
into ``stopping`` is named by what asked: stop, cancel or timeout)."""


_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def stored_context(text: str | None) -> otel_context.Context | None:
    """The context a task's ``trace_context`` holds (``None``: none, or unreadable).

    A ``traceparent`` of version 00 (what ``_now_context`` writes) is read here; any
    other goes through the propagator. Why: the propagator's ``extract`` (a getter,
    a looser pattern, a header list for the state) was 13 % of a task's cost with every
    trace sampled out. With ``_Submitting``, side by side (bench/otel_cost.py, in
    memory, 5 rounds): sampled out 14,750 -> 16,346 tasks/s at best (0.30 -> 0.33 of
    uninstrumented), every span exported 7,601 -> 8,612."""
    if not text:
        return None
    parent, _, state = text.partition(" ")
    read = _VERSION_00.fullmatch(parent)
    if read is not None:
        trace_id, span_id, flags = (int(part, 16) for part in read.groups())
        if not (trace_id and span_id):
            return None
        remote = SpanContext(
            trace_id,
            span_id,
            is_remote=True,
            trace_flags=TraceFlags(flags),
            trace_state=TraceState.from_header([state]) if state else None,
        )
        return trace.set_span_in_context(NonRecordingSpan(remote), otel_context.Context())
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    found = _W3C.extract(carrier)
    span = trace.get_current_span(found).get_span_context()
    return found if span.is_valid else None


def _now_context() -> str | None:
    """The current span's W3C context as a task stores it (``None`` outside a span).
    Written here, not through the propagator's ``inject``: a third of the time, once a
    submit (the format is fixed: version 00)."""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return None
    parent = f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"
    state = span.trace_state.to_header() if span.trace_state else ""
    return f"{parent} {state}" if state and len(state) <= _MAX_STATE else parent


def _past_start(trail: tuple[Any, ...]) -> int:
    """Where the events of the attempt that just began start in its run's trail: past its
    ``starting -> running`` (a pause asked before it started follows at once)."""
    for i in range(len(trail) - TRAIL_WIDTH, -1, -TRAIL_WIDTH):
        if trail[i + 1] == _STARTING and trail[i + 2] == _RUNNING:
            return i + TRAIL_WIDTH
    return len(trail)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


# -- metrics -------------------------------------------------------------------------------
#
# The instrumentation's metrics (docs/observability.md, "Metrics"): what a task's life
# adds to the OTel meter, kept out of the carriers' way.
#
# Transitions and running attempts are counted in dicts of each thread's own and read by
# the meter when it collects (observable instruments): a counter's `add()` is about
# 12 us, its attributes hashed each time, and a task makes four transitions and two
# running changes. Histogram records go through a queue to one thread (`Recorder`).

Tally = dict[tuple[str, ...], int]


class Recorder:
    """Records histogram measurements on a thread of its own. The SDK's histogram takes
    a lock for each record; the carriers of a busy node queued on it, each wait costing
    up to the GIL's switch interval (bench/otel_cost.py, in memory: 3,260 tasks/s
    instrumented with the records made by the carriers, 4,885 with none). A queue's
    ``put`` takes no lock a reader holds, and one thread makes every record."""

    def __init__(self) -> None:
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._queue: SimpleQueue[tuple[Histogram, float, dict[str, Any]] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="chongming-otel", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def after_fork(self) -> None:
        """In a child made by fork(): a thread of its own, unless closed before."""
        if not self._closed:
            self._start()

    def record(self, histogram: Histogram, value: float, attributes: dict[str, Any]) -> None:
        self._queue.put((histogram, value, attributes))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            histogram, value, attributes = item
            try:
                histogram.record(value, attributes)
            except Exception:
                log.exception("a measurement could not be recorded")

    def close(self) -> None:
        """Record what is queued, then stop."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(10)


class TaskMeter:
    """Run durations, queue waits, running attempts, transitions and failures, by task
    name (a task id is never an attribute)."""

    def __init__(self, meter: Meter) -> None:
        self.recorder = Recorder()
        self._local = threading.local()
        self._tallies: list[Tally] = []  # one a thread (``_tally``)
        self._durations = meter.create_histogram(
            "chongming.task.run.duration",
            unit="s",
            description="How long each attempt ran, by task name and outcome.",
        )
        self._waits = meter.create_histogram(
            "chongming.task.queue.wait",
            unit="s",
            description="From a task's creation (or its run-at time) to its first start.",
        )
        meter.create_observable_up_down_counter(
            "chongming.task.running",
            callbacks=[self._observe_running],
            unit="{task}",
            description="Attempts running now on this process, by task name.",
        )
        meter.create_observable_counter(
            "chongming.task.transitions",
            callbacks=[self._observe_moves],
            unit="{transition}",
            description="Status changes this process made, by task name and status.",
        )
        self._failures = meter.create_counter(
            "chongming.task.failures",
            unit="{failure}",
            description="Attempts that ended with a failure, by task name and kind.",
        )

    def ran(self, name: str, outcome: str, seconds: float) -> None:
        attributes = {"chongming.task.name": name, "chongming.task.outcome": outcome}
        self.recorder.record(self._durations, seconds, attributes)

    def waited(self, name: str, seconds: float) -> None:
        self.recorder.record(self._waits, seconds, {"chongming.task.name": name})

    def failed(self, name: str, kind: str, error: str) -> None:
        attributes = {
            "chongming.task.name": name,
            "chongming.failure.kind": kind,
            "error.type": error,
        }
        self._failures.add(1, attributes)

    def running(self, name: str, change: int) -> None:
        tally = self._tally()
        key = ("running", name)
        tally[key] = tally.get(key, 0) + change

    def moved(self, name: str, was: str, to: str) -> None:
        tally = self._tally()
        key = ("moves", name, was, to)
        tally[key] = tally.get(key, 0) + 1

    def after_fork(self) -> None:
        """In a child made by fork(): none of the parent's counts (the parent reports
        those), and a recorder thread of its own."""
        self._local = threading.local()
        self._tallies = []
        self.recorder.after_fork()

    def close(self) -> None:
        self.recorder.close()

    def _tally(self) -> Tally:
        """This thread's counts: only it writes them, so no lock is taken; the meter's
        collection adds every thread's up (a copy of a dict is one step under the GIL)."""
        try:
            tally: Tally = self._local.tally
        except AttributeError:
            tally = self._local.tally = {}
            self._tallies.append(tally)
        return tally

    def _summed(self, kind: str) -> Tally:
        summed: Tally = {}
        for tally in list(self._tallies):
            for key, count in tally.copy().items():
                if key[0] == kind:
                    summed[key[1:]] = summed.get(key[1:], 0) + count
        return summed

    def _observe_moves(self, options: CallbackOptions) -> Iterable[Observation]:
        for (name, was, to), count in self._summed("moves").items():
            yield Observation(
                count,
                {
                    "chongming.task.name": name,
                    "chongming.task.from_status": was,
                    "chongming.task.status": to,
                },
            )

    def _observe_running(self, options: CallbackOptions) -> Iterable[Observation]:
        for (name,), count in self._summed("running").items():
            yield Observation(count, {"chongming.task.name": name})


class _Attempt:
    """One attempt's span, attached to the carrier's context until it ends."""

    __slots__ = ("began", "finished", "first", "run", "span", "token", "watcher")

    def __init__(self, watcher: _Watcher, run: Run, span: trace.Span) -> None:
        self.watcher = watcher
        self.run = run
        self.span = span
        self.token: object = None
        self.first = _past_start(run.writes.trail)
        self.began = time.monotonic()
        self.finished = False

    def ended(self, raised: BaseException | None) -> None:
        try:
            self.watcher.attempt_ended(self, raised)
        except Exception:
            log.exception("task %s: its span could not be ended", self.run.task_id)
        finally:
            try:
                otel_context.detach(self.token)  # type: ignore[arg-type]
            except Exception:
                log.exception("task %s: its trace context could not be let go", self.run.task_id)


class _Current:
    """A span current around a block, ``ERROR`` with the exception recorded if the
    block raised. A span that cannot be started (the instrumentation's fault) is
    logged, and the block goes on with ``INVALID_SPAN``.

    A class, not a generator: the two nested generator context managers a submit's
    span went through were ~7 % of a submit's cost with every trace sampled out (with
    the hand-read context of ``stored_context``: its figures)."""

    __slots__ = ("_attributes", "_kind", "_links", "_name", "_parent", "_token", "_tracer", "span")

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        *,
        links: list[Link] | None = None,
        parent: otel_context.Context | None = None,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._parent = parent
        self._token: Token[otel_context.Context] | None = None
        self.span: trace.Span = trace.INVALID_SPAN

    def __enter__(self) -> trace.Span:
        try:
            self.span = self._tracer.start_span(
                self._name,
                context=self._parent,
                kind=self._kind,
                attributes=self._attributes,
                links=self._links,
            )
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        except Exception:
            log.exception("the %s span could not be started", self._name)
            self.span = trace.INVALID_SPAN
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if self._token is None:
            return
        span = self.span
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        otel_context.detach(self._token)
        span.end()


class _Submitting:
    """Around one submit (``_Watcher.submitting``): a ``PRODUCER`` span current while
    the call runs (``_Current``), told what the call made."""

    __slots__ = ("_current", "_operation", "_watcher")

    def __init__(self, watcher: _Watcher, tracer: Tracer, operation: str) -> None:
        attributes = {
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": operation,
        }
        self._current = _Current(tracer, operation, SpanKind.PRODUCER, attributes)
        self._watcher = watcher
        self._operation = operation

    def __enter__(self) -> Callable[[object], None]:
        self._current.__enter__()
        return self._made

    def _made(self, made: object) -> None:
        self._watcher.made(self._current.span, self._operation, made)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        self._current.__exit__(kind, exc, _)


class _Track:
    """What the watcher keeps of a run it saw, until the run and its attempt ended. A
    lock of its own: only the run's submitter, carrier and writer can meet on it. One
    lock for every run had the submitter and all the carriers queue on it, each wait
    up to the GIL's switch interval (bench/otel_cost.py, in memory: 8 % of the
    uninstrumented rate with it; 13 % with a lock a run and the recorder thread)."""

    __slots__ = ("attempt", "counted", "ended", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counted = 0  # trail items counted as transitions
        self.attempt: _Attempt | None = None  # the attempt open now
        self.ended = False  # the run ended (``run_ended``)


def _after_fork(watcher: _Watcher | None) -> None:
    if watcher is not None:
        watcher.after_fork()


class _Watcher:
    """What the instrumentor installs: spans, metrics and log ids for the run path."""

    def __init__(self, tracer: Tracer, meter: Meter) -> None:
        self._tracer = tracer
        self.meter = TaskMeter(meter)
        self._tracks: dict[str, _Track] = {}  # by task id; each transition counted once
        # A child made by fork() inherits this watcher but not its parent's runs, counts
        # or recorder thread: it starts from nothing (a server that forks its workers).
        own = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(own()))

    def after_fork(self) -> None:
        """In a child made by fork(): none of the parent's runs or counts (the parent
        reports those), and a recorder thread of its own."""
        self._tracks = {}
        self.meter.after_fork()

    # -- submit --------------------------------------------------------------------------------

    def trace_context(self) -> str | None:
        try:
            return _now_context()
        except Exception:
            log.exception("the trace context could not be read; the task is stored without")
            return None

    def submitting(self, operation: str) -> _Submitting:
        return _Submitting(self, self._tracer, operation)

    def made(self, span: trace.Span, operation: str, made: object) -> None:
        try:
            runs: list[Any]
            if isinstance(made, PipelineRun):
                runs = list(made.nodes.values())
            else:
                runs = made if isinstance(made, list) else [made]
            if span.is_recording():  # a span sampled out keeps nothing it is told
                self._describe(span, operation, made, runs)
            for run in runs:
                if getattr(run, "writes", None) is None:
                    continue  # a StoredTask: the holder of the dedupe key
                track = self._tracks.setdefault(run.task_id, _Track())
                with track.lock:
                    self._count(run, track, upto=TRAIL_WIDTH)  # its creation
        except Exception:
            log.exception("the submit span could not be described")

    def _describe(self, span: trace.Span, operation: str, made: object, runs: list[Any]) -> None:
        described: dict[str, Any] = {}
        if isinstance(made, PipelineRun):
            name = made.pipeline.name
            described["chongming.pipeline.run_id"] = made.pipeline_run_id
        else:
            name = str(getattr(runs[0], "name", "")) if runs else ""
            if len(runs) == 1:
                described.update(self._described(runs[0]))
        span.update_name(f"{operation} {name}".rstrip())
        described["messaging.destination.name"] = name
        described["messaging.batch.message_count"] = len(runs)
        span.set_attributes(described)

    def _described(self, run: Any) -> dict[str, Any]:
        described: dict[str, Any] = {
            "chongming.task.id": run.task_id,
            "messaging.message.id": run.task_id,
        }
        writes = getattr(run, "writes", None)
        if writes is None:  # a StoredTask: the holder of the dedupe key, made elsewhere
            described["chongming.task.deduplicated"] = True
            return described
        snapshot = writes.snapshot
        described["chongming.task.name"] = snapshot.name
        if snapshot.bucket is not None:
            described["chongming.task.bucket"] = snapshot.bucket
        if snapshot.owner is not None:
            described["chongming.task.node"] = snapshot.owner
        return described

    @contextmanager
    def firing(self, schedule: str) -> Iterator[None]:
        attributes: dict[str, Any] = {"chongming.schedule.name": schedule}
        # A trace of its own, whatever called it: an empty context is its parent.
        with _Current(
            self._tracer,
            f"fire {schedule}",
            SpanKind.INTERNAL,
            attributes,
            parent=otel_context.Context(),
        ):
            yield

    # -- attempts ------------------------------------------------------------------------------

    def began(self, run: Run) -> observe.Seen:
        try:
            snapshot = run.writes.snapshot
            attributes: dict[str, Any] = {
                "messaging.system": _SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": run.name,
                **self._described(run),
                "chongming.task.attempt": snapshot.attempt,
                "chongming.task.carrier": _carrier(run),
            }
            span = self._tracer.start_span(
                f"run {run.name}",
                context=stored_context(snapshot.trace_context),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            )
            if snapshot.attempt == 1 and snapshot.started_at is not None:
                since = snapshot.run_at or snapshot.created_at
                waited = max(0.0, (snapshot.started_at - since).total_seconds())
                self.meter.waited(run.name, waited)
            attempt = _Attempt(self, run, span)
            track = self._tracks.setdefault(run.task_id, _Track())
            with track.lock:
                track.attempt = attempt
                self._count(run, track)
            self.meter.running(run.name, 1)
            attempt.token = otel_context.attach(trace.set_span_in_context(span))
            return attempt
        except Exception:
            log.exception("task %s: its span could not be started", run.task_id)
            return _Unseen()

    def attempt_ended(self, attempt: _Attempt, raised: BaseException | None) -> None:
        run = attempt.run
        track = self._tracks.get(run.task_id)
        if track is None:
            return  # ended when its run did (an abandoned carrier came back)
        with track.lock:
            if attempt.finished:
                return
            attempt.finished = True
            track.attempt = None
            self._count(run, track)
            if track.ended:
                self._tracks.pop(run.task_id, None)
        self._finish(attempt, raised)

    def run_ended(self, run: Run) -> None:
        try:
            track = self._tracks.get(run.task_id)
            if track is None:
                return  # not seen by this watcher (submitted before it came)
            with track.lock:
                track.ended = True
                attempt = track.attempt
                if attempt is not None and not run.abandoned:
                    return  # its attempt ends next, and counts the rest
                self._count(run, track)
                self._tracks.pop(run.task_id, None)
                if attempt is not None:
                    attempt.finished = True  # its carrier was abandoned: end its span now
            if attempt is not None:
                self._finish(attempt, None)
        except Exception:
            log.exception("task %s: its end could not be recorded", run.task_id)

    def _finish(self, attempt: _Attempt, raised: BaseException | None) -> None:
        run, span = attempt.run, attempt.span
        snapshot = run.writes.snapshot
        trail = run.writes.trail
        status = snapshot.status
        outcome = "retried" if status is TaskStatus.QUEUED else status.value
        for i in range(attempt.first, len(trail), TRAIL_WIDTH):
            _, was, to, at, reason, actor = trail[i : i + TRAIL_WIDTH]
            if to in _TERMINAL:
                continue
            name = _EVENTS.get(to, "")
            if to == TaskStatus.STOPPING.value:
                name = run.signals.stop_kind or "stop"
            elif to == TaskStatus.RUNNING.value and was not in ("paused", "pausing"):
                continue
            event: dict[str, Any] = {"chongming.task.status": to}
            if reason is not None:
                event["chongming.reason"] = reason
            if actor is not None:
                event["chongming.actor"] = actor
            span.add_event(f"chongming.task.{name}", event, timestamp=_ns(at))
        span.set_attribute("chongming.task.outcome", outcome)
        failure = snapshot.failure if outcome in ("failed", "retried") else None
        if failure is not None:
            thrown = failure.kind is FailureKind.EXCEPTION
            error = (failure.exception_type if thrown else None) or failure.kind.value
            span.set_attribute("error.type", error)
            if thrown and isinstance(raised, Exception):
                span.record_exception(raised)
            else:
                described = {"exception.type": error, "exception.message": failure.message}
                if failure.traceback:
                    described["exception.stacktrace"] = failure.traceback
                span.add_event("exception", described)
            span.set_status(Status(StatusCode.ERROR, failure.message))
            self.meter.failed(run.name, failure.kind.value, error)
        self.meter.ran(run.name, outcome, time.monotonic() - attempt.began)
        self.meter.running(run.name, -1)
        span.end()

    def _count(self, run: Run, track: _Track, upto: int | None = None) -> None:
        """Count the run's transitions not counted yet (up to ``upto`` trail items).
        Caller holds the track's lock."""
        trail = run.writes.trail
        end = len(trail) if upto is None else upto
        moved, name = self.meter.moved, run.name
        for i in range(track.counted, end, TRAIL_WIDTH):
            moved(name, trail[i + 1] or "", trail[i + 2])
        track.counted = max(track.counted, end)

    # -- controls and logs -----------------------------------------------------------------------

    @contextmanager
    def controlling(
        self, task: TaskSnapshot, action: CommandAction, reason: str | None, actor: str
    ) -> Iterator[Callable[[ControlReceipt], None]]:
        linked = stored_context(task.trace_context)
        links = []
        if linked is not None:
            links.append(Link(trace.get_current_span(linked).get_span_context()))
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": action.value,
            "messaging.destination.name": task.name,
            "chongming.task.id": task.task_id,
            "chongming.task.name": task.name,
            "chongming.command.action": action.value,
            "chongming.actor": actor,
        }
        if reason is not None:
            attributes["chongming.reason"] = reason
        with _Current(
            self._tracer, f"{action.value} {task.name}", SpanKind.PRODUCER, attributes, links=links
        ) as span:

            def told(receipt: ControlReceipt) -> None:
                span.set_attribute("chongming.control.outcome", receipt.outcome.value)
                if receipt.command_id is not None:
                    span.set_attribute("chongming.command.id", receipt.command_id)

            yield told

    def annotate(self, record: logging.LogRecord) -> None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")


class _Unseen:
    """An attempt whose span could not be started: nothing to end."""

    def ended(self, raised: BaseException | None) -> None:
        return None


class ChongmingTaskInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Spans, metrics and log ids for chongming-task (docs/observability.md):
    ``instrument(tracer_provider=..., meter_provider=...)``, ``uninstrument()``. Found by
    ``opentelemetry-instrument`` through the ``opentelemetry_instrumentor`` entry point."""

    _watcher: _Watcher | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("chongming-task")
        except PackageNotFoundError:  # run from a source tree
            release = "0"
        tracer = trace.get_tracer(_SCOPE, release, kwargs.get("tracer_provider"))
        meter = get_meter(_SCOPE, release, kwargs.get("meter_provider"))
        self._watcher = _Watcher(tracer, meter)
        install_log_context()
        observe.install(self._watcher)

    def _uninstrument(self, **kwargs: Any) -> None:
        if self._watcher is not None:
            observe.remove(self._watcher)
            self._watcher.meter.close()
            self._watcher = None


def _carrier(run: Run) -> str:
    """What carried an attempt: ``thread``, ``async`` (the node's event loop) or
    ``process`` (a worker process)."""
    definition = run.definition
    return "async" if definition.is_async else definition.carrier
