"""A slow store write never blocks the task's own checkpoint(), and the token hears a
control request only once its transition is legal and in the store."""

from __future__ import annotations

import itertools
import threading
import time

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    StopRequested,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.testing import FaultyStore
from tests.conftest import here, run_of, wait_until

S = TaskStatus


class SlowSaves(FaultyStore):
    """Every ``save`` takes ``delay`` seconds while ``slow`` is set (a pool timeout, a
    lock wait: any slow write)."""

    def __init__(self, delay: float) -> None:
        super().__init__(InMemoryTaskStore())
        self.delay = delay
        self.slow = threading.Event()

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        if self.slow.is_set():
            time.sleep(self.delay)
        super().save(snapshot, expect_version=expect_version)


def test_a_slow_write_of_a_control_call_never_blocks_the_tasks_checkpoint() -> None:
    # A write far slower than a checkpoint's pace: a checkpoint that waited for it would
    # leave a gap of seconds, which no scheduling delay of a loaded machine comes near.
    store = SlowSaves(delay=3.0)
    beats: list[float] = []
    seen_in_store: list[S] = []
    with Controller(store, activity_interval=0.02) as c:

        @c.task(name="beating")
        def beating(token: CancellationToken) -> None:
            try:
                while True:
                    token.checkpoint()
                    beats.append(time.monotonic())
                    time.sleep(0.01)
            except StopRequested:
                # The token heard the stop: its transition must be in the store already.
                seen_in_store.append(store.inner.get(here().task_id).status)  # type: ignore[union-attr]
                raise

        run = c.submit(beating)
        wait_until(lambda: len(beats) > 5, what="the task beating")
        store.slow.set()
        started = time.monotonic()
        assert run.stop().outcome == "stopping"  # returns once the (slow) write is done
        assert time.monotonic() - started >= 2.9
        during = [b for b in beats if started <= b <= started + 2.9]
        gaps = [b - a for a, b in itertools.pairwise([started, *during, started + 2.9])]
        assert len(during) >= 3, "the task stopped beating while the stop was being written"
        assert max(gaps) < 2.0, f"a checkpoint waited {max(gaps):.2f}s for the store"
        store.slow.clear()
        assert run.wait(5).status is S.STOPPED
        assert seen_in_store == [S.STOPPING]


def test_pause_and_resume_raced_from_two_threads_end_consistent() -> None:
    """Control calls from several threads: whatever order they land in, the status and
    the token agree at the end (a paused token with a running status would hang)."""
    with Controller(InMemoryTaskStore(), activity_interval=0.02) as c:
        release = threading.Event()

        @c.task(name="loop")
        def loop(token: CancellationToken) -> None:
            while not release.is_set():
                token.checkpoint()
                time.sleep(0.001)

        run = c.submit(loop)
        wait_until(lambda: run.status is S.RUNNING)
        barrier = threading.Barrier(2)

        def pauser() -> None:
            barrier.wait()
            for _ in range(200):
                run.pause()

        def resumer() -> None:
            barrier.wait()
            for _ in range(200):
                run.resume()

        threads = [threading.Thread(target=pauser), threading.Thread(target=resumer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        run.resume()
        wait_until(lambda: run.status is S.RUNNING, what="running after the last resume")
        assert not run_of(run).signals.pause_requested
        release.set()
        assert run.wait(5).status is S.SUCCEEDED
