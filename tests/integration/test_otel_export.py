"""OpenTelemetry sent over OTLP from real processes, to a receiver started here: a node,
the CLI and the dashboard each run under ``opentelemetry-instrument`` (the instrumentor
is found by its entry point, nothing in their code asks for it). The CLI's pause and the
dashboard's resume are linked to the task's trace, the node's run span says who asked,
and the node's metrics arrive. The setup example of the docs sends its trace too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.distro")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chongming_task import SqliteTaskStore, TaskStatus
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import ROOT
from tests.integration.test_web import Web

INSTRUMENT = Path(sys.executable).with_name("opentelemetry-instrument")
NODE = ("--owner", "node-a", "--submit", "loop")


class Receiver:
    """An OTLP/HTTP receiver: every span and metric name it was sent, by service."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service, span)
        self.metrics: list[tuple[str, str]] = []  # (service, metric name)
        self._lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.take(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def take(self, path: str, body: bytes) -> None:
        with self._lock:
            if path == "/v1/traces":
                traces = ExportTraceServiceRequest.FromString(body)
                for resource in traces.resource_spans:
                    service = _service(resource.resource)
                    for scope in resource.scope_spans:
                        self.spans += [(service, span) for span in scope.spans]
            elif path == "/v1/metrics":
                metrics = ExportMetricsServiceRequest.FromString(body)
                for resource in metrics.resource_metrics:
                    service = _service(resource.resource)
                    for scope in resource.scope_metrics:
                        self.metrics += [(service, m.name) for m in scope.metrics]

    def span(self, service: str, name: str) -> Any:
        with self._lock:
            found = [s for who, s in self.spans if who == service and s.name == name]
        assert len(found) == 1, [(who, s.name) for who, s in self.spans]
        return found[0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _service(resource: Any) -> str:
    for attribute in resource.attributes:
        if attribute.key == "service.name":
            return str(attribute.value.string_value)
    return ""


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = getattr(value, value.WhichOneof("value"))
    return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def _env(receiver: Receiver, service: str) -> dict[str, str]:
    return {
        **os.environ,
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _cli(receiver: Receiver, db: Path, *args: str) -> str:
    done = subprocess.run(
        [str(INSTRUMENT), sys.executable, "-m", "chongming_task", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(receiver, "ops-cli"),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_controls_from_the_cli_and_the_dashboard_are_linked_to_the_task_s_trace(
    tmp_path: Path, receiver: Receiver
) -> None:
    db = tmp_path / "tasks.db"
    node = subprocess.Popen(
        [str(INSTRUMENT), sys.executable, "-m", "tests.integration.node", str(db), *NODE],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(receiver, "worker"),
    )
    try:
        assert node.stdout is not None
        task_id = json.loads(node.stdout.readline())["task_id"]
        assert "ready" in json.loads(node.stdout.readline())
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING)
        store = SqliteTaskStore(db)
        stored = store.get(task_id)
        store.close()
        assert stored is not None and stored.trace_context is not None
        paused = _cli(receiver, db, "pause", task_id, "--reason", "audit", "--wait", "10")
        assert "now paused" in paused
        web = Web(db, wrap=(str(INSTRUMENT),), env=_env(receiver, "dashboard"))
        try:
            web.get(f"/tasks/{task_id}")  # the page sets the CSRF cookie its forms carry
            status, body = web.request(f"/tasks/{task_id}/resume", {"csrf": web.csrf()})
            assert status == 200 and "request accepted" in body, body
            wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING)
        finally:
            web.close()
        assert "now stopped" in _cli(receiver, db, "stop", task_id, "--wait", "10")
    finally:
        if node.poll() is None:
            assert node.stdin is not None
            node.stdin.close()
            node.wait(30)
    assert node.returncode == 0, node.stderr.read() if node.stderr else ""

    run = receiver.span("worker", "run loop")
    submit = receiver.span("worker", "submit loop")
    pause = receiver.span("ops-cli", "pause loop")
    assert run.trace_id == submit.trace_id and run.parent_span_id == submit.span_id
    assert stored.trace_context.startswith(f"00-{run.trace_id.hex()}-")
    assert [link.trace_id for link in pause.links] == [run.trace_id]
    assert pause.trace_id != run.trace_id  # the CLI's own trace, linked to the task's
    assert _attributes(pause)["chongming.task.id"] == task_id
    events = [(e.name, {a.key: a.value.string_value for a in e.attributes}) for e in run.events]
    pausing = [said for name, said in events if name == "chongming.task.pause"]
    assert len(pausing) == 1 and pausing[0]["chongming.reason"] == "audit"
    assert pausing[0]["chongming.actor"] == _attributes(pause)["chongming.actor"]
    resume = receiver.span("dashboard", "resume loop")
    assert [link.trace_id for link in resume.links] == [run.trace_id]
    resuming = [said["chongming.actor"] for name, said in events if name == "chongming.task.resume"]
    assert resuming == [_attributes(resume)["chongming.actor"]]
    assert "chongming.task.stop" in [name for name, _ in events]
    assert _attributes(run)["chongming.task.outcome"] == "stopped"
    assert ("worker", "chongming.task.run.duration") in receiver.metrics
    assert ("worker", "chongming.task.transitions") in receiver.metrics


def _example(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """examples/otel_app.py run as a program in ``tmp_path``; it must print its report."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "otel_app.py"), str(tmp_path / "tasks.db")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "report for acme"
    return done


def test_the_setup_example_sends_one_trace_from_request_to_the_task_s_own_span(
    tmp_path: Path, receiver: Receiver
) -> None:
    """examples/otel_app.py, as docs/observability.md gives it, run as a program."""
    env = {
        key: value
        for key, value in _env(receiver, "ignored").items()
        if not key.startswith("OTEL_") or key == "OTEL_EXPORTER_OTLP_ENDPOINT"
    }
    done = _example(tmp_path, env)
    request = receiver.span("reports", "request")
    submit = receiver.span("reports", "submit report")
    run = receiver.span("reports", "run report")
    render = receiver.span("reports", "render")
    assert submit.parent_span_id == request.span_id and run.parent_span_id == submit.span_id
    assert render.parent_span_id == run.span_id
    assert {s.trace_id for s in (request, submit, run, render)} == {request.trace_id}
    assert f"report trace={run.trace_id.hex()} rendering the report of acme" in done.stderr
    assert ("reports", "chongming.task.run.duration") in receiver.metrics


def test_the_setup_example_without_a_collector_prints_its_spans_at_once(tmp_path: Path) -> None:
    """No endpoint: spans to the console, no retries against a collector nobody runs."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = _example(tmp_path, env)
    assert "no OTEL_EXPORTER_OTLP_ENDPOINT" in done.stderr
    assert '"name": "run report"' in done.stderr and '"name": "render"' in done.stderr
    # No collector is tried (one at localhost:4318 would be retried for 15 s).
    assert "retrying" not in done.stderr and "Failed to export" not in done.stderr
