"""A node's health watchers: store faults logged as episodes, service threads that die
logged at CRITICAL and started again."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import pytest

from chongming_task.health import FaultLog, NodeHealth, ServiceWatch
from chongming_task.loops import keep_running
from tests.conftest import wait_until


class Ticks:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_fault_is_one_line_when_it_starts_a_count_and_one_line_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.faults")
    ticks = Ticks()
    faults = FaultLog(log, now=lambda: datetime.now(UTC), monotonic=ticks, quiet=5.0)
    with caplog.at_level(logging.WARNING, logger="test.faults"):
        for i in range(500):  # a full disk: every task's write, every pass
            ticks.t = i * 0.01
            faults.failed(f"write of task t{i}", OSError("database or disk is full"))
        assert faults.since is not None and faults.count == 500
        ticks.t = 6.0
        faults.succeeded()  # a write succeeds, but the last failure is only 1 s old
        ticks.t = 5.5
        faults.check()
        assert faults.since is not None
        ticks.t = 11.0
        faults.check()
    assert faults.since is None and faults.count == 0
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "ERROR",
            "store writes failing (OSError: database or disk is full, first: write of task "
            "t0); counting until they succeed again",
        ),
        (
            "WARNING",
            "store writes succeed again, after 500 failure(s) in 11.0 s "
            "(OSError: database or disk is full)",
        ),
    ]
    assert all(r.exc_info is None for r in caplog.records)  # no tracebacks


def test_a_thread_that_dies_is_said_at_critical_and_started_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = ServiceWatch(now=lambda: datetime.now(UTC))
    runs: list[int] = []
    stop = threading.Event()

    def body() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise OSError("time.sleep failed")
        stop.wait()

    target = keep_running("writer", body, stopping=stop.is_set, watch=watch)
    with caplog.at_level(logging.CRITICAL, logger="chongming_task.services"):
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        wait_until(lambda: len(runs) == 3, what="started again twice")
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 2 and "writer: thread died (OSError" in critical[0].getMessage()
    assert critical[0].exc_info is not None  # said with its exception
    faults, unhealthy = watch.faults()
    assert [(f.service, f.deaths, f.error) for f in faults] == [
        ("writer", 2, "OSError: time.sleep failed")
    ]
    assert unhealthy == ("writer",)  # died within the last minute


def test_a_nodes_health_round_trips_through_its_json() -> None:
    health = NodeHealth(
        store_failing_since=datetime(2026, 12, 5, 12, 0, tzinfo=UTC),
        store_failures=3,
        store_error="StoreError: disk full",
        desynced=2,
    )
    assert NodeHealth.from_json(health.to_json()) == health
    assert not health.healthy and health.problems() == [
        "store writes failing since 12:00:00 (3 failure(s)): StoreError: disk full"
    ]
    assert NodeHealth.from_json("not json") is None and NodeHealth.from_json(None) is None
    assert NodeHealth().healthy and NodeHealth(desynced=4).healthy
