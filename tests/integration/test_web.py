"""The dashboard as a real server process against a store a real node process writes:
pages, a control posted as a form pausing a task the node holds, bad input and forged
forms refused with nothing changed, the access token, /metrics through the Prometheus
parser."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskStatus
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node

pytest.importorskip("starlette", reason="the [web] extra is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Web:
    """A `chongming-task web` process and a cookie-keeping client for it."""

    def __init__(
        self,
        db: Path | str,
        *args: str,
        wrap: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        """``wrap``: a command the dashboard runs under (``opentelemetry-instrument``);
        ``token``: its access token, given as an operator gives it (in the environment:
        the command line refuses one)."""
        if token is not None:
            env = {**(os.environ if env is None else env), "CHONGMING_WEB_TOKEN": token}
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        command = [*wrap, sys.executable, "-m", "chongming_task", "--db", str(db), "web"]
        self.proc = subprocess.Popen(
            [*command, "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"web did not start: {self.proc.stderr.read()}") from None
                time.sleep(0.1)

    def request(
        self, path: str, data: dict[str, str | list[str]] | None = None, **headers: str
    ) -> tuple[int, str]:
        body = None if data is None else urllib.parse.urlencode(data, doseq=True).encode()
        req = urllib.request.Request(self.base + path, data=body, headers=headers)
        try:
            with self.opener.open(req, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def get(self, path: str, **headers: str) -> tuple[int, str]:
        return self.request(path, **headers)

    def csrf(self) -> str:
        for cookie in self.jar:
            if cookie.name == "cm_csrf" and cookie.value:
                return cookie.value
        raise AssertionError("no CSRF cookie was set")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, Node, Web]]:
    db = tmp_path / "web.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop", "--submit", "loop")
    web = Web(db)
    try:
        yield db, node, web
    finally:
        web.close()
        node.finish()


def test_every_page_answers(running: tuple[Path, Node, Web]) -> None:
    db, node, web = running
    first = node.task_ids[0]
    wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
    for path, needle in [
        ("/", "Buckets"),
        ("/live/overview", "Nodes"),
        ("/tasks", first[:12]),
        ("/tasks?status=all&name=lo*", first[:12]),
        (f"/tasks?q={first[:8]}", first[:12]),
        (f"/tasks/{first}", "Timeline"),
        (f"/tasks/{first}/live", "queued → "),
        ("/schedules", "Schedules"),
        ("/nodes", "live"),
        ("/static/htmx.min.js", "htmx"),
    ]:
        status, body = web.get(path)
        assert status == 200, (path, body[:500])
        assert needle in body, (path, needle)
    store = SqliteTaskStore(db)
    owner = store.get(first).owner  # type: ignore[union-attr]
    store.close()
    assert owner
    for path, needle in [
        (f"/tasks?node={urllib.parse.quote(owner)}", first[:12]),
        ("/tasks?node=nobody", "no task matches"),
        ("/nodes", f'href="/tasks?node={urllib.parse.quote(owner)}"'),
    ]:
        status, body = web.get(path)
        assert status == 200 and needle in body, (path, needle, body[-800:])
    status, body = web.get(f"/tasks/{first[:8]}")  # a prefix redirects to the full id
    assert status == 200 and f"<code>{first}</code>" in body
    health = json.loads(web.get("/healthz")[1])
    assert health["ok"] is True and health["store"] == str(db) and health["tasks"] == 2
    assert 0 <= health["figures_age"] < 5


def test_a_pause_posted_from_the_page_pauses_a_task_in_another_process(
    running: tuple[Path, Node, Web],
) -> None:
    db, node, web = running
    first, second = node.task_ids
    wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
    web.get(f"/tasks/{first}")  # the page sets the CSRF cookie its forms carry
    status, body = web.request(f"/tasks/{first}/pause", {"csrf": web.csrf()})
    assert status == 200 and "request accepted (command " in body, body
    wait_until(lambda: stored_status(db, first) is TaskStatus.PAUSED, 15, "paused by the node")
    again = web.request(f"/tasks/{first}/pause", {"csrf": web.csrf()}, **{"HX-Request": "true"})
    assert again[0] == 200 and "already paused" in again[1] and "<html" not in again[1]
    # A selection: both tasks at once, each answered.
    status, body = web.request(
        "/tasks/selection/stop", {"csrf": web.csrf(), "task_id": [first, second]}
    )
    assert status == 200 and body.count("request accepted") == 2, body
    wait_until(lambda: stored_status(db, second) is TaskStatus.STOPPED, 15, "stopped")
    wait_until(lambda: stored_status(db, first) is TaskStatus.STOPPED, 15, "stopped")


def test_bad_input_is_a_clear_error_and_changes_nothing(
    running: tuple[Path, Node, Web],
) -> None:
    db, node, web = running
    first = node.task_ids[0]
    wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
    cases = [
        ("/tasks/zzzzzzzz", 404, "no task zzzzzzzz"),
        ("/tasks/abc", 404, "needs 6+ characters"),
        ("/tasks?status=bogus", 400, "unknown status"),
        ("/tasks?bucket=999", 400, "bad bucket"),
        ("/tasks?bucket=x", 400, "bucket must be a whole number from 0 to 63"),
        ("/tasks?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E", 400, "hex digits"),
        ("/tasks?name=%00%ff", 200, "no task matches"),
    ]
    for path, code, said in cases:
        status, body = web.get(path)
        assert status == code and said in body, (path, status, body[-600:])
        assert "<script>alert(1)</script>" not in body  # escaped, never markup
    web.get("/")
    forged = web.request(f"/tasks/{first}/stop", {"csrf": "forged"})
    assert forged[0] == 403 and "CSRF" in forged[1]
    missing = web.request(f"/tasks/{first}/stop", {})
    assert missing[0] == 403
    unknown = web.request(f"/tasks/{first}/explode", {"csrf": web.csrf()})
    assert unknown[0] == 404
    # A selection with one unknown id: an error page, and nothing sent for the others.
    mixed = web.request(
        "/tasks/selection/stop", {"csrf": web.csrf(), "task_id": [first, "zzzzzzzzzz"]}
    )
    assert mixed[0] == 404 and "no task zzzzzzzzzz" in mixed[1]
    time.sleep(0.3)
    assert stored_status(db, first) is TaskStatus.RUNNING  # nothing changed


def test_read_only_and_the_access_token(tmp_path: Path) -> None:
    db = tmp_path / "guarded.db"
    SqliteTaskStore(db).close()
    refused = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "web", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "give --token" in refused.stderr
    assert refused.stderr.count("\n") == 1
    web = Web(db, "--read-only", token="s3cret")
    try:
        assert web.get("/")[0] == 401
        assert web.get("/", Authorization="Bearer wrong")[0] == 401
        assert web.get("/", Authorization="Bearer s3cret")[0] == 200
        assert web.get("/healthz")[0] == 200  # a probe needs no token
        status, body = web.get("/?token=s3cret")  # once: a cookie, then plain requests
        assert status == 200 and "read-only" in body
        assert web.get("/tasks")[0] == 200
        status, body = web.request("/tasks/t/stop", {"csrf": web.csrf()})
        assert status == 403 and "read-only" in body
    finally:
        web.close()


def test_metrics_parse_and_never_label_a_task_id(running: tuple[Path, Node, Web]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    db, node, web = running
    wait_until(lambda: stored_status(db, node.task_ids[0]) is TaskStatus.RUNNING, what="running")
    status, text = web.get("/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    running_now = [
        s.value for s in families["chongming_tasks"].samples if s.labels == {"status": "running"}
    ]
    assert running_now == [2.0]
    assert sum(s.value for s in families["chongming_nodes"].samples) >= 1
    assert {"chongming_lost_tasks", "chongming_alarms", "chongming_unfinished_tasks"} <= set(
        families
    )
    # The dashboard's follower counts what it sees happen: stop one task, then scrape.
    web.get("/")
    web.request(f"/tasks/{node.task_ids[0]}/stop", {"csrf": web.csrf()})
    wait_until(lambda: stored_status(db, node.task_ids[0]) is TaskStatus.STOPPED, 15, "stopped")

    def counted() -> dict[str, object]:
        return {f.name: f for f in text_string_to_metric_families(web.get("/metrics")[1])}

    wait_until(
        lambda: "stopping -> stopped" in _moves(counted()) and _stops_timed(counted()) == 1,
        10,
        "the follower to count",
    )
    families = counted()
    moves = _moves(families)
    assert moves["running -> stopping"] == 1.0 and moves["stopping -> stopped"] == 1.0
    durations = [
        s
        for s in families["chongming_task_duration_seconds"].samples  # type: ignore[attr-defined]
        if s.name.endswith("_count") and s.labels == {"name": "loop", "outcome": "stopped"}
    ]
    assert [s.value for s in durations] == [1.0]
    # The overview's chart counts the store's finished tasks, read every few seconds.
    wait_until(lambda: "1 stopped" in web.get("/")[1], 15, "the chart to count the stop")
    assert _stops_timed(families) == 1  # the stop, as the node carried it out
    ids = set(node.task_ids)
    for family in families.values():
        for sample in family.samples:
            assert not ids & set(sample.labels.values()), sample
    assert not re.search(r"[0-9a-f]{32}", text)


def _moves(families: dict[str, object]) -> dict[str, float]:
    family = families.get("chongming_transitions")
    if family is None:
        return {}
    return {
        f"{s.labels['from_status']} -> {s.labels['to_status']}": s.value
        for s in family.samples  # type: ignore[attr-defined]
        if s.name.endswith("_total") and s.labels.get("name") == "loop"
    }


def test_reconcile_previews_then_marks_a_dead_nodes_task_lost(tmp_path: Path) -> None:
    db = tmp_path / "dead.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--lease-ttl", "1", "--submit", "loop")
    (task_id,) = node.task_ids
    wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
    node.kill()  # its lease runs out within a second
    web = Web(db)
    try:
        wait_until(lambda: task_id[:12] in web.get("/reconcile")[1], 15, "the preview")
        status, body = web.get("/reconcile")
        assert status == 200 and "1 task(s) would be marked lost" in body
        assert stored_status(db, task_id) is TaskStatus.RUNNING  # a preview changes nothing
        assert web.request("/reconcile", {"csrf": "forged"})[0] == 403
        assert stored_status(db, task_id) is TaskStatus.RUNNING
        status, body = web.request("/reconcile", {"csrf": web.csrf()})
        assert status == 200 and "Marked 1 task(s) lost" in body, body
        assert stored_status(db, task_id) is TaskStatus.LOST
    finally:
        web.close()


def test_paging_walks_every_task_once_even_across_a_tie(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from chongming_task import TaskSnapshot

    db = tmp_path / "pages.db"
    store = SqliteTaskStore(db)
    base = datetime(2026, 12, 1, tzinfo=UTC)
    made = []
    for n in range(130):  # 40 alone, then 60 created at one instant, then 30 alone
        at = base + timedelta(seconds=n if n < 40 else 40 if n < 100 else n)
        task_id = f"{n:04d}" + "a" * 28
        store.create(
            TaskSnapshot(
                task_id=task_id,
                name="paged",
                status=TaskStatus.SUCCEEDED,
                status_version=4,
                created_at=at,
            )
        )
        made.append(task_id)
    store.close()
    web = Web(db)
    try:
        seen: list[str] = []
        path = "/tasks?status=all"
        for _ in range(10):
            status, body = web.get(path)
            assert status == 200, body
            seen += re.findall(r'href="/tasks/([0-9a-f]{32})"', body)
            older = re.search(r'class="older" href="([^"]+)"', body)
            if older is None:
                break
            path = older.group(1).replace("&amp;", "&")
        assert seen == list(reversed(made))  # newest first, each exactly once
        assert web.get("/tasks?status=all&until=yesterday")[0] == 400
        assert web.get("/tasks?status=all&until=2026-12-01T00:00:00&skip=1")[0] == 400
    finally:
        web.close()


def test_a_pipeline_run_is_drawn_as_a_graph(tmp_path: Path) -> None:
    import threading

    from chongming_task import CancellationToken, Controller, Pipeline

    db = tmp_path / "graph.db"
    gate = threading.Event()

    def extract(token: CancellationToken) -> int:
        return 3

    def transform(token: CancellationToken) -> int:
        while not gate.is_set():
            token.checkpoint()
            token.sleep(0.02)
        return 4

    def load(token: CancellationToken) -> int:
        return 5

    with Controller(SqliteTaskStore(db), owner="node-p") as node:
        etl = Pipeline("etl")
        etl.add("extract", extract)
        etl.add("transform", transform, depends_on=["extract"])
        etl.add("load", load, depends_on=["transform"])
        etl.add("audit", extract)  # no dependency: a second root
        run = node.submit_pipeline(etl)
        wait_until(lambda: run.nodes["transform"].status is TaskStatus.RUNNING, what="running")
        web = Web(db)
        try:
            status, listing = web.get("/pipelines")
            assert status == 200 and run.pipeline_run_id[:12] in listing and "etl" in listing
            status, body = web.get(f"/pipelines/{run.pipeline_run_id[:8]}")  # a prefix
            assert status == 200, body
            drawn = dict(re.findall(r'data-key="(\w+)" data-status="(\w+)"', body))
            assert drawn == {
                "extract": "succeeded",
                "transform": "running",
                "load": "pending",
                "audit": "succeeded",
            }
            assert body.count('class="edge"') == 2  # extract -> transform -> load
            gate.set()
            run.wait(20)
            live = web.get(f"/pipelines/{run.pipeline_run_id}/live")[1]
            assert dict(re.findall(r'data-key="(\w+)" data-status="(\w+)"', live))["load"] == (
                "succeeded"
            )
            assert web.get("/pipelines/ffffffffffff")[0] == 404
            # The tasks page takes the run by a prefix too, as the CLI does.
            listed = web.get(f"/tasks?status=all&pipeline={run.pipeline_run_id[:8]}")[1]
            assert all(r.task_id[:12] in listed for r in run.nodes.values())
            assert listed.count('<a href="/tasks/') == len(run.nodes)
        finally:
            web.close()


def _stops_timed(families: dict[str, object]) -> float:
    """How many stop commands the command-latency histogram has observed."""
    family = families.get("chongming_command_latency_seconds")
    if family is None:
        return 0.0
    return float(
        sum(
            s.value
            for s in family.samples  # type: ignore[attr-defined]
            if s.name.endswith("_count") and s.labels.get("action") == "stop"
        )
    )


def test_ctrl_c_ends_the_dashboard_normally(tmp_path: Path) -> None:
    import signal

    db = tmp_path / "ctrlc.db"
    SqliteTaskStore(db).close()
    web = Web(db)
    # An open page's event stream must not hold the stop (nor end it with an error).
    stream = urllib.request.urlopen(web.base + "/events", timeout=20)
    try:
        assert stream.readline() == b"retry: 2000\n"
        started = time.monotonic()
        web.proc.send_signal(signal.SIGINT)
        _, err = web.proc.communicate(timeout=20)
    finally:
        stream.close()
    assert web.proc.returncode == 0, err
    assert time.monotonic() - started < 3, "the stop waited for the open stream"
    assert "Traceback" not in err and "error" not in err.lower(), err


def test_the_event_stream_says_change_after_a_transition(
    running: tuple[Path, Node, Web],
) -> None:
    db, node, web = running
    first = node.task_ids[0]
    wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
    web.get("/")
    stream = urllib.request.urlopen(web.base + "/events", timeout=20)
    try:
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.readline() == b"retry: 2000\n"
        web.request(f"/tasks/{first}/pause", {"csrf": web.csrf()})
        lines = [stream.readline()]
        while b"event: change\n" not in lines:
            lines.append(stream.readline())
            assert len(lines) < 50, lines
        assert stream.readline().startswith(b"data: ")
    finally:
        stream.close()


def test_a_sick_node_and_a_late_report_show_on_the_pages_healthz_and_metrics(
    tmp_path: Path,
) -> None:
    """What a node says of its health (store writes failing, a dead thread, runs
    desynced) and a late report beside a lost task reach every view of the dashboard."""
    from datetime import UTC, datetime, timedelta

    from prometheus_client.parser import text_string_to_metric_families

    from chongming_task import TaskSnapshot
    from chongming_task.health import NodeHealth, ServiceFault, WorkerProcesses
    from chongming_task.late import LateReport
    from chongming_task.model import NodeRecord

    db = tmp_path / "web.db"
    store = SqliteTaskStore(db)
    now = datetime.now(UTC)
    store.declare_node(
        NodeRecord(
            node="node-a",
            buckets=None,
            num_buckets=64,
            ttl_seconds=3600.0,
            started_at=now,
            seen_at=now,
            host="h",
            pid=1,
            health=NodeHealth(
                store_failing_since=now - timedelta(seconds=20),
                store_failures=41,
                store_error="StoreError: database or disk is full",
                services=(ServiceFault(service="writer", deaths=2, error="OSError: x", at=now),),
                unhealthy_services=("writer",),
                desynced=1,
                processes=WorkerProcesses(busy=1, idle=2, started=5, replaced=3, crashed=2),
            ),
        )
    )
    store.create(
        TaskSnapshot(
            task_id="late0001",
            name="job",
            status=TaskStatus.LOST,
            status_version=4,
            created_at=now,
            ended_at=now,
        )
    )
    store.record_late_report(
        LateReport(
            task_id="late0001",
            reported_by="node-a",
            reported_at=now,
            status=TaskStatus.SUCCEEDED,
            stored_status=TaskStatus.LOST,
            ended_at=now,
            outcome={"rows": 3},
        )
    )
    store.close()
    web = Web(db)
    try:
        health = json.loads(web.get("/healthz")[1])
        assert health["ok"] is True and health["nodes_healthy"] is False
        (sick,) = health["unhealthy_nodes"]
        assert sick["node"] == "node-a"
        assert any("store writes failing" in p for p in sick["problems"])
        assert any("service writer died 2 time(s)" in p for p in sick["problems"])
        page = web.get("/tasks/late0001")[1]
        assert "Late report" in page and "node-a reported it succeeded" in page
        assert "store writes failing (41)" in web.get("/nodes")[1]
        families = {f.name: f for f in text_string_to_metric_families(web.get("/metrics")[1])}

        def value(name: str, **labels: str) -> float:
            (sample,) = [s for s in families[name].samples if s.labels == labels]
            return float(sample.value)

        assert value("chongming_node_healthy", node="node-a") == 0
        assert value("chongming_node_store_write_failures", node="node-a") == 41
        assert value("chongming_node_service_deaths", node="node-a", service="writer") == 2
        assert value("chongming_node_desynced_runs", node="node-a") == 1
        assert value("chongming_node_worker_processes", node="node-a", state="busy") == 1
        assert value("chongming_node_worker_processes", node="node-a", state="idle") == 2
        assert value("chongming_node_worker_processes_started", node="node-a") == 5
        assert value("chongming_node_worker_processes_replaced", node="node-a") == 3
        assert value("chongming_node_worker_processes_crashed", node="node-a") == 2
        assert value("chongming_late_reports") == 1
        assert value("chongming_alarms", kind="late-report") == 1
        assert value("chongming_alarms", kind="node-unhealthy") == 1
    finally:
        web.close()


def test_a_delayed_task_shows_when_it_runs(tmp_path: Path) -> None:
    """A task delayed on a node: the dashboard's list and its page say when it runs
    (and its priority), from another process."""
    from chongming_task import CancellationToken, Controller

    db = tmp_path / "delayed.db"
    with Controller(SqliteTaskStore(db), owner="later") as node:

        @node.task(name="report")
        def report(token: CancellationToken) -> None:
            return None

        run = node.tasks["report"].configure(delay=600, priority=4).submit()
        web = Web(db)
        try:
            status, listed = web.get("/tasks")
            assert status == 200 and "queued (runs at " in listed and "in 9m" in listed
            status, page = web.get(f"/tasks/{run.task_id}/live")
            assert status == 200 and "queued (runs at " in page and "priority 4" in page
        finally:
            web.close()
        node.cancel(run.task_id)
