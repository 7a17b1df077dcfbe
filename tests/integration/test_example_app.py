"""The Starlette example (examples/starlette_app.py), driven through the framework's
test client: the node in the app's lifespan, a task submitted, paused, resumed, done."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the [web] extra is not installed")
pytest.importorskip("httpx2", reason="Starlette's test client needs httpx2")

from examples.starlette_app import app
from starlette.testclient import TestClient


def _until(client: TestClient, task_id: str, status: str, timeout: float = 15) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        data = client.get(f"/tasks/{task_id}").json()
        if data["status"] == status or time.monotonic() > deadline:
            return data  # type: ignore[no-any-return]
        time.sleep(0.02)


def test_the_example_app_submits_pauses_and_resumes_an_async_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHONGMING_DB", str(tmp_path / "reports.db"))
    with TestClient(app) as client:
        made = client.post("/reports?rows=2000")
        assert made.status_code == 202
        task_id = made.json()["task_id"]
        assert _until(client, task_id, "running")["status"] == "running"
        assert client.post(f"/tasks/{task_id}/pause").json()["outcome"] == "pausing"
        paused = _until(client, task_id, "paused")
        assert paused["status"] == "paused"
        time.sleep(0.3)
        assert client.get(f"/tasks/{task_id}").json()["progress"] == paused["progress"]
        assert client.post(f"/tasks/{task_id}/resume").json()["outcome"] == "resumed"
        done = _until(client, task_id, "succeeded")
        assert done == {"status": "succeeded", "progress": 2000, "result": {"rows": 2000}}
        assert client.get("/tasks/nosuchtask").status_code == 404
        for bad in ("/tasks/nosuchtask/pause", "/tasks/nosuchtask/resume"):
            answer = client.post(bad)
            assert answer.status_code == 404 and "nosuchtask" in answer.json()["error"]
        for rows in ("abc", "-5", "0", "1e9", "99999999999"):
            answer = client.post(f"/reports?rows={rows}")
            assert answer.status_code == 400 and "rows must be" in answer.json()["error"]


def test_the_walkthrough_task_runs_long_enough_to_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from examples import starlette_app

    rows = re.search(r"reports\?rows=(\d+)", starlette_app.__doc__ or "")
    assert rows is not None
    monkeypatch.setenv("CHONGMING_DB", str(tmp_path / "walk.db"))
    with TestClient(app) as client:
        task_id = client.post(f"/reports?rows={rows[1]}").json()["task_id"]
        assert _until(client, task_id, "running")["status"] == "running"
        time.sleep(1)  # a person typing the next command
        assert client.post(f"/tasks/{task_id}/pause").json()["outcome"] == "pausing"
        assert _until(client, task_id, "paused")["status"] == "paused"
