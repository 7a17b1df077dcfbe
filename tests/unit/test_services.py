"""Each background loop is an object whose pass can be called directly: no thread, no
sleep, time from a fake clock."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    IntervalTrigger,
    SystemClock,
    TaskStatus,
)
from chongming_task.health import HealthMonitor
from chongming_task.node.commands import CommandPoller
from chongming_task.node.leaseclock import LeaseClock
from chongming_task.node.registry import RunRegistry
from chongming_task.node.services import NodeContext
from chongming_task.stores.capabilities import Capabilities
from chongming_task.testing import FakeClock
from tests.conftest import wait_until


def test_a_supervisor_pass_renews_a_lease_that_used_a_third_of_its_ttl() -> None:
    clock = FakeClock()
    release = threading.Event()
    # A long interval: the supervisor's own thread makes one pass at start, then sleeps;
    # the passes below are the test's.
    with Controller(InMemoryTaskStore(), clock=clock, lease_ttl=30, activity_interval=3600) as c:
        run = c.submit(c.task(lambda token: release.wait(10), name="wait"))
        first = c.get(run.task_id).lease_until
        assert first == clock.now() + timedelta(seconds=30)
        supervisor = c._services.supervisor
        renewal = supervisor.duties[0]
        assert renewal.name == "lease renewal"
        clock.advance(5)  # a sixth of the TTL: not due yet
        assert renewal.run_once(clock.monotonic()).done == 0
        assert c.get(run.task_id).lease_until == first
        clock.advance(6)  # past a third
        assert supervisor.run_once().done >= 1  # what the pass did: the renewal
        assert c.get(run.task_id).lease_until == clock.now() + timedelta(seconds=30)
        clock.advance(1)  # renewed a moment ago: the duty's next pass is later
        assert renewal.run_once(clock.monotonic()).done == 0
        release.set()
        assert run.wait(5).status is TaskStatus.SUCCEEDED


def test_a_schedule_runner_tick_fires_what_is_due_and_nothing_else() -> None:
    clock = FakeClock()
    with Controller(InMemoryTaskStore(), clock=clock, run_schedules=False) as c:
        c.task(lambda token: None, name="beat")
        entry = c.schedule("beat", "beat", IntervalTrigger(60))
        assert c._services.scheduler.tick() == []
        clock.advance(60)
        (fired,) = c._services.scheduler.tick()
        assert fired.wait(5).status is TaskStatus.SUCCEEDED
        assert entry.fired == 1 and c._services.scheduler.tick() == []


def test_a_command_poller_pass_releases_what_it_does_not_hold() -> None:
    """The pass alone: a command for a task this poller's registry does not hold is
    given back, never completed, so the holder can still claim it."""
    store = InMemoryTaskStore()
    # The holder's own poller makes one pass when it starts, then sleeps an hour.
    with Controller(store, command_poll_interval=3600) as holder:
        gate = threading.Event()

        @holder.task(name="wait")
        def wait(token: CancellationToken) -> None:
            while not gate.is_set():
                token.checkpoint()
                token.sleep(0.01)

        run = holder.submit(wait)
        wait_until(lambda: run.status is TaskStatus.RUNNING)
        clock = SystemClock()  # real time: the lease it takes must not have expired
        caps = Capabilities(store)
        other = CommandPoller(
            NodeContext(
                owner="other",
                clock=clock,
                now=clock.now,
                registry=RunRegistry(),
                capabilities=caps,
                leases=LeaseClock(caps, clock.now, clock.monotonic),
                health=HealthMonitor(logging.getLogger("test"), now=clock.now),
            ),
            lease=30,
            interval=1,
        )
        console = Controller(store, poll_commands=False)
        receipt = console.stop(run.task_id)
        assert receipt.accepted
        assert other.poll_once() == 0  # claimed and released, not completed
        # Claimable at once: released, not left under the other's 30 s lease.
        assert holder.poll_commands_once() == 1
        assert run.wait(5).status is TaskStatus.STOPPED
        console.close()


def test_a_pipeline_runner_pass_reacts_to_every_ended_node_in_order() -> None:
    """The pipeline runner's pass, driven by hand with no thread: every node ended so far,
    in the order they ended, and a ``Pass`` that says how many."""
    from chongming_task.node.pipeline_runner import PipelineRunner

    seen: list[str] = []

    class Group:
        def node_finished(self, run: Any) -> None:
            seen.append(run.task_id)

    class Ended:
        def __init__(self, task_id: str) -> None:
            self.task_id = task_id
            self.pipeline = Group()

    runner = PipelineRunner(owner="t")
    assert runner.run_once().done == 0
    for task_id in ("a", "b", "c"):
        runner.node_ended(Ended(task_id))  # type: ignore[arg-type]
    assert runner.run_once().done == 3
    assert seen == ["a", "b", "c"]
    assert runner.run_once().done == 0


def test_a_worker_pool_pass_carries_one_ready_run_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker pool's pass, driven by hand with its threads never started: each pass
    carries one run that may start, on the caller's thread, and says so."""
    from chongming_task.node.workers import WorkerPool

    monkeypatch.setattr(WorkerPool, "start", lambda self: None)
    with Controller(InMemoryTaskStore(), max_workers=1) as c:
        ran_on: list[str] = []

        @c.task(name="where")
        def where(token: CancellationToken) -> None:
            ran_on.append(threading.current_thread().name)

        first, second = c.submit(where), c.submit(where)
        workers = c._services.workers
        assert workers.run_once().done == 1
        assert first.wait(5).status is TaskStatus.SUCCEEDED
        assert second.status is TaskStatus.QUEUED
        assert workers.run_once().done == 1
        assert second.wait(5).status is TaskStatus.SUCCEEDED
        assert workers.run_once().done == 0
        assert ran_on == [threading.current_thread().name] * 2
