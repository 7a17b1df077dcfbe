"""What OpenTelemetry costs a task: no-op tasks with and without the instrumentation.

    uv run python bench/otel_cost.py [--tasks N] [--workers W] [--rounds R]

bench/throughput.py's ``run_controller`` (the same no-op tasks, workers and timing from
the first submit to the last task's end), in memory and on a SQLite file, per call, in
three settings made side by side in one process, the order turning from round to round:

- ``off``: not instrumented, the reference;
- ``on``: ``ChongmingTaskInstrumentor`` with the SDK's ``TracerProvider`` (every span
  sampled, a ``BatchSpanProcessor`` into an exporter that counts and drops them) and a
  ``MeterProvider`` whose reader collects once a run: two spans a task (``submit``,
  ``run``), five instruments;
- ``sampled out``: the same, with a sampler that records no span (what a service
  sampling 0 % of its traces pays: the metrics, the stored context, the non-recording
  spans).

Each row gives tasks/s, and each round's ratio to ``off`` with their median. Spans
exported per task are checked (2.0 when on, 0 when sampled out), so a row that did less
work cannot pass for cheap.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

from _stats import in_rounds  # bench/ is on sys.path when run as a script
from chongming_task import InMemoryTaskStore, SqliteTaskStore
from chongming_task.otel import ChongmingTaskInstrumentor
from throughput import run_controller

SETTINGS = ("off", "on", "sampled out")


class Dropped(SpanExporter):
    """Counts the spans it is given and keeps none."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def timed(
    setting: str, tasks: int, workers: int, make: Callable[[], object]
) -> tuple[float, float]:
    """Tasks/s of one run and the spans it exported per task."""
    if setting == "off":
        return tasks / run_controller(tasks, workers, make), 0.0
    sampler: Sampler = ALWAYS_ON if setting == "on" else ALWAYS_OFF
    exporter = Dropped()
    tracer_provider = TracerProvider(sampler=sampler)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=4 * tasks, max_export_batch_size=512)
    )
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instrumentor = ChongmingTaskInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        elapsed = run_controller(tasks, workers, make)
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()  # exports what is queued (outside the timed window)
    assert reader.get_metrics_data() is not None
    meter_provider.shutdown()
    return tasks / elapsed, exporter.spans / tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otel-cost-") as folder:
        made = [0]

        def sqlite() -> object:
            made[0] += 1
            return SqliteTaskStore(Path(folder) / f"run-{made[0]}.db")

        stores: dict[str, Callable[[], object]] = {"memory": InMemoryTaskStore, "sqlite": sqlite}
        contenders = {
            f"{where} {setting}": (
                lambda where=where, setting=setting: timed(
                    setting, args.tasks, args.workers, stores[where]
                )
            )
            for where in stores
            for setting in SETTINGS
        }
        results = in_rounds(contenders, args.rounds)
    print(
        f"{args.tasks} no-op tasks a run, {args.workers} workers, {args.rounds} rounds, "
        "per-call submit; tasks/s (spans exported a task)"
    )
    for where in stores:
        reference = [rate for rate, _ in results[f"{where} off"]]
        for setting in SETTINGS:
            name = f"{where} {setting}"
            rates = [rate for rate, _ in results[name]]
            spans = {round(n, 3) for _, n in results[name]}
            expected = {"off": {0.0}, "on": {2.0}, "sampled out": {0.0}}[setting]
            assert spans == expected, f"{name}: {spans} spans a task, expected {expected}"
            ratios = [rate / ref for rate, ref in zip(rates, reference, strict=True)]
            print(
                f"  {name:<20} best {max(rates):>8,.0f}/s  "
                f"rounds {' · '.join(f'{r:,.0f}' for r in rates)}  "
                f"to off: {' · '.join(f'{r:.2f}' for r in ratios)} "
                f"(median {statistics.median(ratios):.2f})  spans/task {min(spans):.1f}"
            )


if __name__ == "__main__":
    main()
