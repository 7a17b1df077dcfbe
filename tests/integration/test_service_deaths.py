"""No background thread of a node dies in silence: a failure injected into each service
escapes its loop, is said at CRITICAL, the thread is started again, the service goes on
working, and the node's health says so (``health()``, its declaration in the store,
``doctor``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    IntervalTrigger,
    Pipeline,
    SqliteTaskStore,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.control import StoreControl
from chongming_task.model import CommandAction
from chongming_task.node import dispatch
from chongming_task.pipelines import PipelineRun
from tests.conftest import wait_until

S = TaskStatus


class Injected(BaseException):
    """What the injection raises: past every ``except Exception`` of a pass, as a fault
    of the interpreter or the machine would be (a faulty ``time.sleep``, say)."""


class FailOnce:
    """Make ``owner.attr`` raise ``Injected`` once, in the first thread whose name starts
    with ``prefix`` that calls it; every other call goes through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, prefix: str):
        self.fired = threading.Event()
        original = getattr(owner, attr)
        lock = threading.Lock()

        def patched(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name.startswith(prefix):
                with lock:
                    fire = not self.fired.is_set()
                    self.fired.set()
                if fire:
                    raise Injected(f"injected into {prefix}")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, attr, patched)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Controller, SqliteTaskStore, Path]]:
    db = tmp_path / "node.db"
    store = SqliteTaskStore(db)
    c = Controller(
        store,
        owner="node-a",
        owned_buckets=range(64),
        lease_ttl=0.9,
        activity_interval=0.05,
        command_poll_interval=0.05,
        reconcile_interval=0.3,
    )
    c.task(name="quick")(lambda token, n=0: n)

    @c.task(name="loop")
    def loop(token: CancellationToken) -> None:
        while True:
            token.checkpoint()
            token.sleep(0.01)

    yield c, store, db
    c.close(timeout=5)
    store.close()


def _dead_task(store: SqliteTaskStore, task_id: str) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    store.create(
        TaskSnapshot(
            task_id=task_id,
            name="orphan",
            status=S.RUNNING,
            status_version=3,
            created_at=past,
            lease_owner="gone",
            lease_until=past,
        )
    )


def _quick_tasks_still_run(c: Controller) -> None:
    assert [c.tasks["quick"].submit(n).result(timeout=10) for n in range(5)] == list(range(5))


def _still_working(service: str, c: Controller, store: SqliteTaskStore) -> None:
    """What each service does, done again after its thread was started again."""
    if service in ("writer", "workers"):
        _quick_tasks_still_run(c)
    elif service == "supervisor":
        run = c.tasks["loop"].submit()
        wait_until(lambda: (store.get(run.task_id) or run.snapshot()).lease_until is not None)
        first = store.get(run.task_id)
        assert first is not None
        wait_until(lambda: store.get(run.task_id).lease_until > first.lease_until)  # type: ignore[union-attr]
        c.stop(run.task_id)
    elif service == "commands":
        run = c.tasks["loop"].submit()
        wait_until(lambda: (store.get(run.task_id) or run.snapshot()).status is S.RUNNING)
        StoreControl(store, owner="console").send(run.task_id, CommandAction.STOP)
        assert run.wait(timeout=10).status is S.STOPPED
    elif service == "beacon":
        (before,) = c.capabilities.nodes()
        wait_until(lambda: c.capabilities.nodes()[0].seen_at > before.seen_at)
    elif service == "schedules":
        c.schedule("tick", "quick", IntervalTrigger(seconds=0.2))
        wait_until(lambda: len(c.list_tasks()) >= 2, what="the schedule firing again")
    elif service == "reconcile":
        _dead_task(store, "orphan-after")
        wait_until(lambda: store.get("orphan-after").status is S.LOST)  # type: ignore[union-attr]
    elif service == "pipelines":
        p = Pipeline("flow")
        p.add("a", "quick")
        p.add("b", "quick", depends_on=["a"])
        ended = c.submit_pipeline(p).wait(timeout=10)
        assert [ended[k].status for k in ("a", "b")] == [S.SUCCEEDED, S.SUCCEEDED]
    else:  # pragma: no cover - a service added to the list below without a check
        raise AssertionError(service)


def _inject(service: str, c: Controller, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Arrange for ``service``'s thread to die once; return what makes it run into it."""
    if service == "workers":
        for kind in (dispatch.FifoDispatcher, dispatch.FairDispatcher):
            fail = FailOnce(monkeypatch, kind, "get", "chongming-worker")
        return lambda: _quick_tasks_still_run(c)
    if service == "pipelines":
        fail = FailOnce(monkeypatch, PipelineRun, "node_finished", "chongming-pipelines")

        def react() -> None:
            p = Pipeline("first")
            p.add("a", "quick")
            p.add("b", "quick", depends_on=["a"])
            c.submit_pipeline(p)
            wait_until(fail.fired.is_set)

        return react
    prefix = {
        "supervisor": "chongming-supervisor",
        "commands": "chongming-commands",
        "beacon": "chongming-beacon",
        "schedules": "chongming-scheduler",
        "reconcile": "chongming-reconcile",
        "writer": "chongming-writer",
    }[service]
    # Every loop of these waits between passes (Event.wait is a Condition.wait).
    fail = FailOnce(monkeypatch, threading.Condition, "wait", prefix)

    def run_into() -> None:
        _quick_tasks_still_run(c)  # every service is started by then
        if service == "schedules":  # its thread starts with the first schedule
            c.schedule("hourly", "quick", IntervalTrigger(seconds=3600))
        wait_until(fail.fired.is_set, what=f"the injection into {service}")

    return run_into


SERVICES = [
    "supervisor",
    "commands",
    "beacon",
    "schedules",
    "reconcile",
    "writer",
    "workers",
    "pipelines",
]


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_thread_that_dies_is_said_started_again_and_in_the_nodes_health(
    node: tuple[Controller, SqliteTaskStore, Path],
    service: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    c, store, db = node
    with caplog.at_level(logging.CRITICAL, logger="chongming_task.services"):
        _inject(service, c, monkeypatch)()
        wait_until(
            lambda: service in [f.service for f in c.health().services],
            what=f"{service}'s death in the node's health",
        )
        monkeypatch.undo()  # the machine is well again
        _still_working(service, c, store)
    said = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(said) == 1 and "thread died (Injected" in said[0].getMessage()
    assert said[0].exc_info is not None
    health = c.health()
    assert not health.healthy and service in health.unhealthy_services
    # Written into the node's declaration, where the tools read it.
    wait_until(
        lambda: (
            service in (c.capabilities.nodes()[0].health or health).unhealthy_services
            and c.capabilities.nodes()[0].health is not None
        ),
        what="the health in the declaration",
    )
    if service == "supervisor":  # the tools, once: doctor raises it
        doctor = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "--json", "doctor"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        alarms = json.loads(doctor.stdout)["alarms"]
        sick = [a for a in alarms if a["kind"] == "node-unhealthy"]
        assert sick and "service supervisor died 1 time(s)" in sick[0]["message"]
