"""Traces and metrics of a node sent to an OTLP collector (Jaeger, Tempo, the
OpenTelemetry Collector): docs/observability.md.

    pip install "chongming-task[otel]" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 python examples/otel_app.py tasks.db

Each report's trace holds the caller's ``request`` span, its ``submit`` span, and one
``run`` span per attempt, with the task's own ``render`` span inside. Without
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces and metrics twins) there is no collector
to send to: the spans are printed to stderr instead, and the metrics left out.
"""

from __future__ import annotations

import logging
import os
import sys

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from chongming_task import CancellationToken, Controller
from chongming_task.otel import ChongmingTaskInstrumentor

resource = Resource.create({"service.name": "reports"})
tracer_provider = TracerProvider(resource=resource)
collector = any(
    os.environ.get(f"OTEL_EXPORTER_OTLP{which}_ENDPOINT") for which in ("", "_TRACES", "_METRICS")
)
if collector:  # the exporters read the endpoint themselves
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    readers = [PeriodicExportingMetricReader(OTLPMetricExporter())]
else:  # nobody to send to: a console, not 15 s of retries against localhost:4318
    print("no OTEL_EXPORTER_OTLP_ENDPOINT: spans go to the console", file=sys.stderr)
    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    readers = []
meter_provider = MeterProvider(resource=resource, metric_readers=readers)
ChongmingTaskInstrumentor().instrument(
    tracer_provider=tracer_provider, meter_provider=meter_provider
)
tracer = tracer_provider.get_tracer("reports")
handler = logging.StreamHandler()
handler.setFormatter(
    logging.Formatter(
        "%(levelname)s %(task_name)s trace=%(trace_id)s %(message)s",
        defaults={"task_name": "-", "trace_id": "-"},
    )
)
logging.basicConfig(handlers=[handler], level=logging.INFO)

node = Controller(sys.argv[1] if len(sys.argv) > 1 else "tasks.db")


@node.task(name="report")
def report(token: CancellationToken, customer: str) -> str:
    with tracer.start_as_current_span("render"):
        token.checkpoint()
        logging.info("rendering the report of %s", customer)
    return f"report for {customer}"


with tracer.start_as_current_span("request"):
    run = report.submit("acme")
print(run.result(timeout=30))
node.close()
tracer_provider.shutdown()  # sends what is still batched
meter_provider.shutdown()
