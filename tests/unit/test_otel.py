"""OpenTelemetry (``chongming_task.otel``), read back through the SDK's in-memory
exporter and metric reader: one trace from submit to each attempt, the events of a
task's controls, errors, pipelines and schedules, metrics, log ids, and nothing once
uninstrumented."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import here

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from chongming_task import (
    CancellationToken,
    Controller,
    IntervalTrigger,
    Pipeline,
    RetryPolicy,
    TaskStatus,
    observe,
)
from chongming_task.control import StoreControl
from chongming_task.model import CommandAction
from chongming_task.otel import ChongmingTaskInstrumentor
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing import FakeClock

Make = Callable[..., Controller]
log = logging.getLogger("tests.otel")


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        got = list(self.spans.get_finished_spans())
        return [s for s in got if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for m in scope.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    made = Otel()
    instrumentor = ChongmingTaskInstrumentor()
    instrumentor.instrument(
        tracer_provider=made.tracer_provider, meter_provider=made.meter_provider
    )
    try:
        yield made
    finally:
        instrumentor.uninstrument()


def wait_for(check: Callable[[], bool], timeout: float = 10) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        done.wait(0.01)
    raise AssertionError("not seen in time")


def test_submit_and_each_attempt_are_one_trace(make_controller: Make, otel: Otel) -> None:
    c = make_controller(owned_buckets=[2], num_buckets=4, owner="node-a")

    @c.task(name="flaky", retries=1, backoff=RetryPolicy(base_delay=0.001, jitter=0.0))
    def flaky(token: CancellationToken) -> str:
        if here().attempt == 1:
            raise ValueError("first try fails")
        return "done"

    key = next(f"k{i}" for i in range(100) if c.bucket_policy.bucket_for(f"k{i}") == 2)
    with otel.tracer.start_as_current_span("request") as request:
        run = c.tasks["flaky"].configure(bucket_key=key).submit()
    assert run.wait(10).status is TaskStatus.SUCCEEDED
    wait_for(lambda: len(otel.finished("run flaky")) == 2)
    (submit,) = otel.finished("submit flaky")
    first, second = sorted(otel.finished("run flaky"), key=lambda s: s.start_time or 0)
    trace_id = request.get_span_context().trace_id
    assert submit.kind is SpanKind.PRODUCER and submit.context is not None
    assert submit.parent is not None and submit.parent.span_id == request.get_span_context().span_id
    for span, attempt in ((first, 1), (second, 2)):
        assert span.kind is SpanKind.CONSUMER and span.context is not None
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == submit.context.span_id
        assert (
            dict(span.attributes or {}).items()
            >= {
                "chongming.task.id": run.task_id,
                "chongming.task.name": "flaky",
                "chongming.task.bucket": 2,
                "chongming.task.attempt": attempt,
                "chongming.task.node": "node-a",
                "chongming.task.carrier": "thread",
                "messaging.operation.type": "process",
            }.items()
        )
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["chongming.task.outcome"] == "retried"
    assert [e.name for e in first.events] == ["chongming.task.retry", "exception"]
    exception = dict(first.events[1].attributes or {})
    assert exception["exception.type"] == "ValueError"
    assert exception["exception.message"] == "first try fails"
    assert second.status.status_code is StatusCode.UNSET
    assert (second.attributes or {})["chongming.task.outcome"] == "succeeded"
    assert run.snapshot().trace_context is not None
    assert run.snapshot().trace_context.startswith(f"00-{trace_id:032x}-")  # type: ignore[union-attr]


def test_a_refused_submit_ends_its_span_in_error_and_leaves_the_callers_context(
    make_controller: Make, otel: Otel
) -> None:
    c = make_controller()

    @c.task(name="one")
    def one(token: CancellationToken, n: int) -> int:
        return n

    with otel.tracer.start_as_current_span("request") as request:
        with pytest.raises(TypeError):
            c.tasks["one"].submit()  # a missing argument: refused at submit
        assert trace.get_current_span() is request  # the submit's span was let go
    (refused,) = otel.finished("submit")
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description is not None
    assert refused.status.description.startswith("TypeError")
    assert [e.name for e in refused.events] == ["exception"]
    assert refused.parent is not None
    assert refused.parent.span_id == request.get_span_context().span_id


_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "stored",
    [
        _PARENT,
        f"{_PARENT} congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",  # not sampled
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # no trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # no span id
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",  # a digit short
        "00-0x f7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later",  # a later version
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "not a context",
    ],
)
def test_a_stored_context_reads_as_the_w3c_propagator_reads_it(stored: str) -> None:
    """The run span's parent, read from ``trace_context`` by hand for version 00, is
    the context the SDK's own propagator extracts from the same headers, or none
    where it finds no valid one."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from chongming_task.otel import stored_context

    parent, _, state = stored.partition(" ")
    headers = {"traceparent": parent, **({"tracestate": state} if state else {})}
    expected = trace.get_current_span(
        TraceContextTextMapPropagator().extract(headers)
    ).get_span_context()
    read = stored_context(stored)
    if not expected.is_valid:
        assert read is None
        return
    assert read is not None
    assert trace.get_current_span(read).get_span_context() == expected
    assert trace.get_current_span(read).get_span_context().trace_state == expected.trace_state


def test_a_run_span_says_which_carrier_ran_the_attempt(make_controller: Make, otel: Otel) -> None:
    from tests.integration import process_tasks

    c = make_controller(max_processes=1)
    pid = c.task(process_tasks.pid, carrier="process", name="pid")

    @c.task(name="coroutine")
    async def coroutine(token: CancellationToken) -> None:
        return None

    assert pid.submit().wait(60).status is TaskStatus.SUCCEEDED
    assert coroutine.submit().wait(10).status is TaskStatus.SUCCEEDED
    wait_for(lambda: bool(otel.finished("run pid")) and bool(otel.finished("run coroutine")))
    (process,) = otel.finished("run pid")
    (loop,) = otel.finished("run coroutine")
    assert (process.attributes or {})["chongming.task.carrier"] == "process"
    assert (loop.attributes or {})["chongming.task.carrier"] == "async"


def test_controls_are_events_that_say_who_and_why(tmp_path: Path, otel: Otel) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.db")
    going = threading.Event()
    with Controller(store, owner="node-a", command_poll_interval=0.02) as c:

        @c.task(name="loop")
        def loop(token: CancellationToken) -> None:
            going.set()
            while True:
                token.checkpoint()
                token.sleep(0.01)

        run = c.tasks["loop"].submit()
        assert going.wait(10)
        operator = StoreControl(store, owner="ops@console")
        receipt = operator.send(run.task_id, CommandAction.PAUSE, "deploy window")
        assert receipt.accepted
        wait_for(lambda: run.status is TaskStatus.PAUSED)
        c.resume(run.task_id, reason="window over")
        wait_for(lambda: run.status is TaskStatus.RUNNING)
        c.stop(run.task_id, reason="no longer needed")
        assert run.wait(10).status is TaskStatus.STOPPED
    wait_for(lambda: len(otel.finished("run loop")) == 1)
    (span,) = otel.finished("run loop")
    said = [dict(e.attributes or {}) for e in span.events]
    events = [
        (e.name, a.get("chongming.actor"), a.get("chongming.reason"))
        for e, a in zip(span.events, said, strict=True)
    ]
    assert events == [
        ("chongming.task.pause", "ops@console", "deploy window"),
        ("chongming.task.paused", "node-a", "acknowledged at a checkpoint"),
        ("chongming.task.resume", "node-a", "window over"),
        ("chongming.task.stop", "node-a", "no longer needed"),
    ]
    assert (span.attributes or {})["chongming.task.outcome"] == "stopped"
    assert span.status.status_code is StatusCode.UNSET
    (control,) = otel.finished("pause loop")
    assert control.kind is SpanKind.PRODUCER and span.context is not None
    assert [link.context.trace_id for link in control.links] == [span.context.trace_id]
    assert (
        dict(control.attributes or {}).items()
        >= {
            "chongming.task.id": run.task_id,
            "chongming.actor": "ops@console",
            "chongming.reason": "deploy window",
            "chongming.control.outcome": "accepted",
        }.items()
    )
    store.close()


def test_a_timeout_is_an_event_and_an_error(make_controller: Make, otel: Otel) -> None:
    c = make_controller()

    @c.task(name="slow", timeout=0.05)
    def slow(token: CancellationToken) -> None:
        while True:
            token.sleep(0.01)

    assert c.tasks["slow"].submit().wait(10).status is TaskStatus.FAILED
    wait_for(lambda: len(otel.finished("run slow")) == 1)
    (span,) = otel.finished("run slow")
    assert [e.name for e in span.events] == ["chongming.task.timeout", "exception"]
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "timeout"
    assert (span.events[1].attributes or {})["exception.type"] == "timeout"


def test_a_pipeline_is_one_trace_and_a_schedule_firing_starts_its_own(
    make_controller: Make, otel: Otel
) -> None:
    clock = FakeClock()
    c = make_controller(clock=clock, run_schedules=False)
    c.task(lambda token, x=0: x, name="value")
    pipe = Pipeline("two")
    pipe.add("a", "value", args=(1,))
    pipe.add("b", "value", args=(2,), depends_on=["a"])
    c.schedule("every-10s", "value", IntervalTrigger(10))
    with otel.tracer.start_as_current_span("caller"):
        done = c.submit_pipeline(pipe)
        clock.advance(10)
        (fired,) = c.tick_schedules()
    assert all(s.status is TaskStatus.SUCCEEDED for s in done.wait(10).values())
    assert fired.wait(10).status is TaskStatus.SUCCEEDED
    wait_for(lambda: len(otel.finished("run value")) == 3)
    (submit,) = otel.finished("submit two")
    assert submit.context is not None
    assert (submit.attributes or {})["chongming.pipeline.run_id"] == done.pipeline_run_id
    assert (submit.attributes or {})["messaging.batch.message_count"] == 2
    runs = {(s.attributes or {})["chongming.task.id"]: s for s in otel.finished("run value")}
    for node in done.nodes.values():
        span = runs[node.task_id]
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == submit.context.trace_id
        assert span.parent.span_id == submit.context.span_id
    (firing,) = otel.finished("fire every-10s")
    (caller,) = otel.finished("caller")
    assert firing.parent is None and firing.context is not None and caller.context is not None
    assert firing.context.trace_id != caller.context.trace_id
    scheduled = runs[fired.task_id]
    assert scheduled.context is not None and scheduled.context.trace_id == firing.context.trace_id


def test_a_process_tasks_own_spans_nest_under_its_run_span_and_its_logs_say_so(
    make_controller: Make, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.integration import process_tasks

    c = make_controller(max_processes=1)
    traced = c.task(process_tasks.traced, carrier="process", name="traced")
    with caplog.at_level(logging.INFO):
        run = traced.submit()
        inside = run.result(60)
    wait_for(lambda: bool(otel.finished("run traced")))
    (span,) = otel.finished("run traced")
    assert span.context is not None
    assert inside == {  # the child's span is a child of the run span, in its trace
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": inside["span_id"],  # type: ignore[index]
        "parent": format(span.context.span_id, "016x"),
    }
    (record,) = [r for r in caplog.records if r.getMessage() == "inside the child's span"]
    assert (record.task_id, record.trace_id, record.span_id) == (  # type: ignore[attr-defined]
        run.task_id,
        format(span.context.trace_id, "032x"),
        inside["span_id"],  # type: ignore[index]
    )


def test_async_tasks_have_their_span_current_and_log_records_carry_its_ids(
    make_controller: Make, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()

    @c.task(name="fetch")
    async def fetch(token: CancellationToken, n: int) -> int:
        with otel.tracer.start_as_current_span(f"inner {n}"):
            await asyncio.sleep(0.01)
        log.warning("fetched %s", n)
        return n

    with caplog.at_level(logging.INFO):
        runs = [c.tasks["fetch"].submit(n) for n in range(3)]
        assert [r.result(10) for r in runs] == [0, 1, 2]
    wait_for(lambda: len(otel.finished("run fetch")) == 3)
    spans = {(s.attributes or {})["chongming.task.id"]: s for s in otel.finished("run fetch")}
    for n, run in enumerate(runs):
        span = spans[run.task_id]
        (inner,) = otel.finished(f"inner {n}")
        assert span.context is not None and inner.parent is not None
        assert inner.parent.span_id == span.context.span_id
        (record,) = [r for r in caplog.records if r.getMessage() == f"fetched {n}"]
        assert (record.task_id, record.trace_id, record.span_id) == (  # type: ignore[attr-defined]
            run.task_id,
            format(span.context.trace_id, "032x"),
            format(span.context.span_id, "016x"),
        )


def test_metrics_count_runs_waits_transitions_and_failures(
    make_controller: Make, otel: Otel
) -> None:
    c = make_controller()
    c.task(lambda token: "ok", name="fine")

    @c.task(name="broken")
    def broken(token: CancellationToken) -> None:
        raise KeyError("missing")

    assert c.tasks["fine"].submit().wait(10).status is TaskStatus.SUCCEEDED
    assert c.tasks["broken"].submit().wait(10).status is TaskStatus.FAILED
    wait_for(lambda: len(otel.finished()) == 4)  # two submits, two runs
    # The histograms are recorded on the instrumentation's own thread: once both are in.
    wait_for(lambda: sum(p.count for p in otel.points("chongming.task.run.duration")) == 2)

    durations = {
        (p.attributes["chongming.task.name"], p.attributes["chongming.task.outcome"]): p.count
        for p in otel.points("chongming.task.run.duration")
    }
    assert durations == {("fine", "succeeded"): 1, ("broken", "failed"): 1}
    waits = {
        p.attributes["chongming.task.name"]: p.count
        for p in otel.points("chongming.task.queue.wait")
    }
    assert waits == {"fine": 1, "broken": 1}
    running = {
        p.attributes["chongming.task.name"]: p.value for p in otel.points("chongming.task.running")
    }
    assert running == {"fine": 0, "broken": 0}
    moves = {
        (
            p.attributes["chongming.task.name"],
            p.attributes["chongming.task.from_status"],
            p.attributes["chongming.task.status"],
        ): p.value
        for p in otel.points("chongming.task.transitions")
    }
    path = [("", "queued"), ("queued", "starting"), ("starting", "running")]
    assert moves == {
        **{("fine", *step): 1 for step in path},
        ("fine", "running", "succeeded"): 1,
        **{("broken", *step): 1 for step in path},
        ("broken", "running", "failed"): 1,
    }
    failures = [(p.attributes, p.value) for p in otel.points("chongming.task.failures")]
    assert failures == [
        (
            {
                "chongming.task.name": "broken",
                "chongming.failure.kind": "exception",
                "error.type": "builtins.KeyError",
            },
            1,
        )
    ]


def test_nothing_is_traced_or_stored_once_uninstrumented(make_controller: Make) -> None:
    made = Otel()
    instrumentor = ChongmingTaskInstrumentor()
    instrumentor.instrument(
        tracer_provider=made.tracer_provider, meter_provider=made.meter_provider
    )
    instrumentor.uninstrument()
    c = make_controller()
    c.task(lambda token: None, name="plain")
    with made.tracer.start_as_current_span("caller"):
        run = c.tasks["plain"].submit()
    assert run.wait(10).status is TaskStatus.SUCCEEDED
    assert run.snapshot().trace_context is None
    assert [s.name for s in made.finished()] == ["caller"]


class BrokenTracer(trace.Tracer):
    """A tracer whose every span fails to start: the instrumentation's own fault."""

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        raise RuntimeError("exporter misconfigured")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter misconfigured")


class BrokenProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return BrokenTracer()


def test_a_fault_of_the_instrumentation_costs_the_task_nothing(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    made = Otel()
    instrumentor = ChongmingTaskInstrumentor()
    instrumentor.instrument(tracer_provider=BrokenProvider(), meter_provider=made.meter_provider)
    try:
        c = make_controller()
        c.task(lambda token: "still done", name="plain")
        with caplog.at_level(logging.ERROR, logger="chongming_task.otel"):
            run = c.tasks["plain"].submit()
            assert run.result(10) == "still done"
        said = [r.getMessage() for r in caplog.records]
        assert "the submit span could not be started" in said
        assert f"task {run.task_id}: its span could not be started" in said
    finally:
        instrumentor.uninstrument()


def test_a_duplicate_submit_says_which_task_holds_its_key(
    tmp_path: Path, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder is another node's task: the second submit's span names it."""
    gate = threading.Event()
    stores = [SqliteTaskStore(tmp_path / "tasks.db") for _ in range(2)]
    with Controller(stores[0], owner="a") as a, Controller(stores[1], owner="b") as b:
        for node in (a, b):

            @node.task(name="daily")
            def daily(token: CancellationToken) -> None:
                gate.wait(10)

        with caplog.at_level(logging.ERROR, logger="chongming_task.otel"):
            first = a.tasks["daily"].configure(dedupe_key="2026-12-06").submit()
            again = b.tasks["daily"].configure(dedupe_key="2026-12-06").submit()
            gate.set()
        assert type(again).__name__ == "StoredTask" and again.task_id == first.task_id
        assert first.wait(10).status is TaskStatus.SUCCEEDED
    for store in stores:
        store.close()
    assert [r.getMessage() for r in caplog.records] == []
    (made,) = otel.finished("submit daily")
    (answered,) = otel.finished("submit")
    assert (made.attributes or {})["chongming.task.id"] == first.task_id
    assert (
        dict(answered.attributes or {}).items()
        >= {
            "chongming.task.id": first.task_id,
            "chongming.task.deduplicated": True,
        }.items()
    )


def test_an_abandoned_carrier_s_span_ends_with_its_task(make_controller: Make, otel: Otel) -> None:
    """A thread task that ignores its timeout's stop is abandoned ``failed``: its span
    ends then, not when (if ever) its thread returns, and only once."""
    c = make_controller()
    release, returned = threading.Event(), threading.Event()

    @c.task(name="stubborn", timeout=0.05, timeout_grace=0.05)
    def stubborn(token: CancellationToken) -> None:
        release.wait(10)  # never checks its token
        returned.set()

    run = c.tasks["stubborn"].submit()
    assert run.wait(10).status is TaskStatus.FAILED
    wait_for(lambda: len(otel.finished("run stubborn")) == 1)
    (span,) = otel.finished("run stubborn")
    assert [e.name for e in span.events] == ["chongming.task.timeout", "exception"]
    assert (span.attributes or {})["chongming.task.outcome"] == "failed"
    release.set()  # the thread returns; its late end is not recorded again
    assert returned.wait(10)
    threading.Event().wait(0.2)  # the carrier's own end of the attempt, just after
    assert len(otel.finished("run stubborn")) == 1


def test_a_pause_asked_before_the_start_is_an_event_of_the_attempt(
    make_controller: Make, otel: Otel
) -> None:
    c = make_controller(max_workers=1)
    gate = threading.Event()
    c.task(lambda token: gate.wait(10), name="blocker")
    going = threading.Event()

    @c.task(name="later")
    def later(token: CancellationToken) -> None:
        going.set()
        while True:
            token.checkpoint()
            token.sleep(0.005)

    c.tasks["blocker"].submit()
    run = c.tasks["later"].submit()
    assert c.pause(run.task_id, reason="not yet").outcome.value == "pause-pending"
    gate.set()
    wait_for(lambda: run.status is TaskStatus.PAUSED)
    c.stop(run.task_id)
    assert run.wait(10).status is TaskStatus.STOPPED
    wait_for(lambda: len(otel.finished("run later")) == 1)
    (span,) = otel.finished("run later")
    assert [e.name for e in span.events][:2] == ["chongming.task.pause", "chongming.task.paused"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_records_its_own_measurements(otel: Otel) -> None:
    """A server that forks its workers after instrumenting: each child gets a recorder
    thread of its own (the parent's does not cross fork())."""
    watcher = observe.watcher
    assert watcher is not None
    recorder = watcher.meter.recorder  # type: ignore[attr-defined]
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
        pid = os.fork()
    if pid == 0:  # the child: say whether its recorder runs, and leave at once
        os.write(write, b"1" if recorder.running else b"0")
        os._exit(0)
    os.close(write)
    said = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert said == b"1" and recorder.running
