"""The ready queue between ``submit`` and the workers (``FifoDispatcher``), with real
threads: every run reaches exactly one worker, one parked worker is woken a run (the one
that parked last), retries wait out their delay, and ``close`` ends every worker."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from chongming_task.clock import SystemClock
from chongming_task.node.dispatch import FifoDispatcher
from tests.conftest import wait_until

if TYPE_CHECKING:
    from chongming_task.run.life import Run


def _switches(thread: threading.Thread) -> int:
    """How many times ``thread`` has blocked (Linux: each wake and sleep again is one)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


class _Plain:
    """A definition as the dispatcher reads it: no per-key limit, a thread task."""

    name = "plain"
    max_per_key = None
    is_async = False


class _Unpaused:
    """A token no pause was asked of."""

    @staticmethod
    def hold_while_paused(resumed: object) -> bool:
        return False


class _Run(str):
    """A run as the dispatcher sees it: its priority and definition (it only hands runs
    over)."""

    priority = 0
    definition = _Plain()
    concurrency_key = None
    signals = _Unpaused()


@dataclass(frozen=True)
class Bucketed:
    """A run as the fair dispatcher sees it: its bucket and priority."""

    name: str
    bucket: int
    priority: int = 0
    definition: object = _Plain()
    concurrency_key: str | None = None
    signals: object = _Unpaused()


def _run(n: int, priority: int = 0) -> Run:
    run = _Run(f"run-{n}")
    run.priority = priority
    return cast("Run", run)


class _Workers:
    """Threads that take runs until ``get`` says ``None``, each recording what it got."""

    def __init__(self, dispatcher: FifoDispatcher, count: int) -> None:
        self.dispatcher = dispatcher
        self.got: dict[int, list[object]] = {i: [] for i in range(count)}
        self.threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(count)
        ]

    def _work(self, i: int) -> None:
        while (run := self.dispatcher.get()) is not None:
            self.got[i].append(run)

    def start_one_by_one(self) -> None:
        """Start the threads in order, each parked before the next starts."""
        for n, thread in enumerate(self.threads, 1):
            thread.start()
            wait_until(lambda n=n: self.dispatcher.parked == n, timeout=5)

    def all(self) -> list[object]:
        return [run for runs in self.got.values() for run in runs]


def test_every_run_reaches_exactly_one_worker_and_close_ends_them_all() -> None:
    dispatcher = FifoDispatcher(SystemClock())
    workers = _Workers(dispatcher, 4)
    workers.start_one_by_one()
    runs = [_run(n) for n in range(2000)]
    for run in runs:
        dispatcher.put(run)
    wait_until(lambda: len(workers.all()) == len(runs), timeout=10)
    dispatcher.close()
    for thread in workers.threads:
        thread.join(5)
        assert not thread.is_alive()
    assert sorted(map(str, workers.all())) == sorted(map(str, runs))
    assert dispatcher.get() is None  # closed and empty: a late caller is told at once


def test_a_run_wakes_the_worker_that_parked_last_and_nobody_else() -> None:
    dispatcher = FifoDispatcher(SystemClock())
    workers = _Workers(dispatcher, 4)
    workers.start_one_by_one()  # worker 3 parked last
    others = workers.threads[:3]
    before = [_switches(t) for t in others] if sys.platform == "linux" else []
    dispatcher.put(_run(1))
    wait_until(lambda: workers.got[3] == ["run-1"], timeout=5)
    # It parks again, last once more; the three others were never woken.
    wait_until(lambda: dispatcher.parked == 4, timeout=5)
    assert workers.got[0] == workers.got[1] == workers.got[2] == []
    if before:
        assert [_switches(t) for t in others] == before
    dispatcher.put(_run(2))
    wait_until(lambda: workers.got[3] == ["run-1", "run-2"], timeout=5)
    dispatcher.close()
    for thread in workers.threads:
        thread.join(5)


def test_a_retry_waits_out_its_delay_with_every_worker_parked() -> None:
    dispatcher = FifoDispatcher(SystemClock())
    workers = _Workers(dispatcher, 2)
    workers.start_one_by_one()
    scheduled = time.monotonic()
    dispatcher.schedule(_run(1), 0.1)
    assert not dispatcher.backlog()
    wait_until(lambda: workers.all() == ["run-1"], timeout=5)
    assert time.monotonic() - scheduled >= 0.1
    # The timer released it to one parked worker; the other stayed parked throughout.
    wait_until(lambda: dispatcher.parked == 2, timeout=5)
    dispatcher.put(_run(2))
    wait_until(lambda: sorted(map(str, workers.all())) == ["run-1", "run-2"], timeout=5)
    dispatcher.close()
    for thread in workers.threads:
        thread.join(5)
        assert not thread.is_alive()


def test_racing_producers_and_workers_lose_no_run_with_switches_every_microsecond() -> None:
    """No lock of its own: a worker looks at the runs again after it parks, so a put
    that found nobody parked is still taken. Retries released by the timer thread put
    runs at the same time."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        dispatcher = FifoDispatcher(SystemClock())
        workers = _Workers(dispatcher, 4)
        for thread in workers.threads:
            thread.start()
        per_producer = 1500

        def produce(p: int) -> None:
            for n in range(per_producer):
                run = _run(p * per_producer + n)
                if n % 100 == 0:
                    dispatcher.schedule(run, 0.002)
                else:
                    dispatcher.put(run)

        producers = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(30)
        wait_until(lambda: len(workers.all()) == 3 * per_producer, timeout=30)
        dispatcher.close()
        for thread in workers.threads:
            thread.join(5)
            assert not thread.is_alive()
    finally:
        sys.setswitchinterval(before)
    assert sorted(map(str, workers.all())) == sorted(str(_run(n)) for n in range(3 * per_producer))


def test_a_run_put_while_the_worker_parks_is_taken() -> None:
    """One run at a time, each put as the worker comes back for the next: a wake lost
    between a worker's look at the runs and its parking would leave a run untaken. (The
    interpreter rarely switches threads inside that window; ``get`` looks again after
    parking so that no interleaving can lose a run, and this test cannot force one.)"""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        dispatcher = FifoDispatcher(SystemClock())
        workers = _Workers(dispatcher, 1)
        workers.threads[0].start()
        got = workers.got[0]
        for n in range(3000):
            dispatcher.put(_run(n))
            deadline = time.monotonic() + 5
            while len(got) <= n:  # no sleep: the next put comes as the worker parks
                assert time.monotonic() < deadline, f"run {n} was never taken"
        dispatcher.close()
        workers.threads[0].join(5)
    finally:
        sys.setswitchinterval(before)
    assert got == [_run(n) for n in range(3000)]


def test_get_nowait_hands_over_what_may_start_and_never_waits() -> None:
    """Both shapes: ``get_nowait`` gives the next run that may start, ``None`` when there
    is none, and the fair one keeps its per-bucket limit (a run of a busy bucket waits
    until its bucket's run is done)."""
    from chongming_task.node.dispatch import FairDispatcher

    fifo = FifoDispatcher(SystemClock())
    assert fifo.get_nowait() is None
    fifo.put(_run(1))
    fifo.put(_run(2))
    assert [fifo.get_nowait(), fifo.get_nowait(), fifo.get_nowait()] == [
        _run(1),
        _run(2),
        None,
    ]

    fair = FairDispatcher(SystemClock(), max_parallel_per_bucket=1)
    a1, a2, b1 = Bucketed("a1", 0), Bucketed("a2", 0), Bucketed("b1", 1)
    for run in (a1, a2, b1):
        fair.put(cast("Run", run))
    taken = [fair.get_nowait(), fair.get_nowait(), fair.get_nowait()]
    assert taken == [a1, b1, None]  # a2 waits: bucket 0 is at its limit
    fair.done(cast("Run", a1))
    assert fair.get_nowait() == a2
    fair.close()
    assert fair.get_nowait() is None


def test_higher_priorities_go_first_and_each_priority_in_arrival_order() -> None:
    from chongming_task.node.dispatch import FairDispatcher

    fifo = FifoDispatcher(SystemClock())
    for n, priority in [(1, 0), (2, 5), (3, 0), (4, -1), (5, 5), (6, 9), (7, -1)]:
        fifo.put(_run(n, priority))
    assert fifo.backlog()
    taken = [fifo.get_nowait() for _ in range(8)]
    assert taken == ["run-6", "run-2", "run-5", "run-1", "run-3", "run-4", "run-7", None]
    assert not fifo.backlog()

    # Per bucket at most one running: the highest head among buckets below their limit.
    fair = FairDispatcher(SystemClock(), max_parallel_per_bucket=1)
    runs = [Bucketed("a-low", 0), Bucketed("b-mid", 1, 3), Bucketed("a-top", 0, 7)]
    runs += [Bucketed("c-zero", 2), Bucketed("b-top", 1, 9)]
    for run in runs:
        fair.put(cast("Run", run))
    first = [fair.get_nowait() for _ in range(4)]
    assert [r.name for r in first if r is not None] == ["b-top", "a-top", "c-zero"]
    assert first[3] is None  # every bucket at its limit
    for run in first[:3]:
        fair.done(cast("Run", run))
    assert [getattr(fair.get_nowait(), "name", None) for _ in range(3)] == [
        "b-mid",
        "a-low",
        None,
    ]


def test_runs_waiting_for_their_time_cost_a_timer_not_a_poll() -> None:
    """10,000 runs delayed an hour: the parked workers and the timer thread sleep (no
    wake-up in half a second); one due sooner is released on time to one worker."""
    dispatcher = FifoDispatcher(SystemClock())
    workers = _Workers(dispatcher, 2)
    workers.start_one_by_one()
    for n in range(10_000):
        dispatcher.schedule(_run(n), 3600)
    timer = next(t for t in threading.enumerate() if t.name == "chongming-timer")
    threads = (*workers.threads, timer)

    def parked() -> bool:  # no thread switched in 50 ms: the schedules are taken in
        before = [_switches(t) for t in threads]
        time.sleep(0.05)
        return [_switches(t) for t in threads] == before

    wait_until(parked, what="the workers and the timer to park")
    before = [_switches(t) for t in threads]
    time.sleep(0.5)  # the window watched: no wake-up in it
    assert [_switches(t) for t in threads] == before
    asked = time.monotonic()
    dispatcher.schedule(_run(-1), 0.2)
    wait_until(lambda: workers.all() == ["run--1"], timeout=5)
    assert 0.2 <= time.monotonic() - asked < 2.0
    dispatcher.close()
    for thread in (*workers.threads, timer):
        thread.join(5)
        assert not thread.is_alive()
