"""The instrumentation's metrics (``chongming_task.otel``; docs/observability.md,
"Metrics"): what a task's life adds to the OTel meter, kept out of the carriers' way.

Transitions and running attempts are counted in dicts of each thread's own and read by
the meter when it collects (observable instruments): a counter's ``add()`` is about
12 us, its attributes hashed each time, and a task makes four transitions and two
running changes. Histogram records go through a queue to one thread (``Recorder``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from queue import SimpleQueue
from typing import Any

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

__all__ = ["Recorder", "TaskMeter"]

log = logging.getLogger("chongming_task.otel")

Tally = dict[tuple[str, ...], int]


class Recorder:
    """Records histogram measurements on a thread of its own. The SDK's histogram takes
    a lock for each record; the carriers of a busy node queued on it, each wait costing
    up to the GIL's switch interval (bench/otel_cost.py, in memory: 3,260 tasks/s
    instrumented with the records made by the carriers, 4,885 with none). A queue's
    ``put`` takes no lock a reader holds, and one thread makes every record."""

    def __init__(self) -> None:
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._queue: SimpleQueue[tuple[Histogram, float, dict[str, Any]] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="chongming-otel", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def after_fork(self) -> None:
        """In a child made by fork(): a thread of its own, unless closed before."""
        if not self._closed:
            self._start()

    def record(self, histogram: Histogram, value: float, attributes: dict[str, Any]) -> None:
        self._queue.put((histogram, value, attributes))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            histogram, value, attributes = item
            try:
                histogram.record(value, attributes)
            except Exception:
                log.exception("a measurement could not be recorded")

    def close(self) -> None:
        """Record what is queued, then stop."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(10)


class TaskMeter:
    """Run durations, queue waits, running attempts, transitions and failures, by task
    name (a task id is never an attribute)."""

    def __init__(self, meter: Meter) -> None:
        self.recorder = Recorder()
        self._local = threading.local()
        self._tallies: list[Tally] = []  # one a thread (``_tally``)
        self._durations = meter.create_histogram(
            "chongming.task.run.duration",
            unit="s",
            description="How long each attempt ran, by task name and outcome.",
        )
        self._waits = meter.create_histogram(
            "chongming.task.queue.wait",
            unit="s",
            description="From a task's creation (or its run-at time) to its first start.",
        )
        meter.create_observable_up_down_counter(
            "chongming.task.running",
            callbacks=[self._observe_running],
            unit="{task}",
            description="Attempts running now on this process, by task name.",
        )
        meter.create_observable_counter(
            "chongming.task.transitions",
            callbacks=[self._observe_moves],
            unit="{transition}",
            description="Status changes this process made, by task name and status.",
        )
        self._failures = meter.create_counter(
            "chongming.task.failures",
            unit="{failure}",
            description="Attempts that ended with a failure, by task name and kind.",
        )

    def ran(self, name: str, outcome: str, seconds: float) -> None:
        attributes = {"chongming.task.name": name, "chongming.task.outcome": outcome}
        self.recorder.record(self._durations, seconds, attributes)

    def waited(self, name: str, seconds: float) -> None:
        self.recorder.record(self._waits, seconds, {"chongming.task.name": name})

    def failed(self, name: str, kind: str, error: str) -> None:
        attributes = {
            "chongming.task.name": name,
            "chongming.failure.kind": kind,
            "error.type": error,
        }
        self._failures.add(1, attributes)

    def running(self, name: str, change: int) -> None:
        tally = self._tally()
        key = ("running", name)
        tally[key] = tally.get(key, 0) + change

    def moved(self, name: str, was: str, to: str) -> None:
        tally = self._tally()
        key = ("moves", name, was, to)
        tally[key] = tally.get(key, 0) + 1

    def after_fork(self) -> None:
        """In a child made by fork(): none of the parent's counts (the parent reports
        those), and a recorder thread of its own."""
        self._local = threading.local()
        self._tallies = []
        self.recorder.after_fork()

    def close(self) -> None:
        self.recorder.close()

    def _tally(self) -> Tally:
        """This thread's counts: only it writes them, so no lock is taken; the meter's
        collection adds every thread's up (a copy of a dict is one step under the GIL)."""
        try:
            tally: Tally = self._local.tally
        except AttributeError:
            tally = self._local.tally = {}
            self._tallies.append(tally)
        return tally

    def _summed(self, kind: str) -> Tally:
        summed: Tally = {}
        for tally in list(self._tallies):
            for key, count in tally.copy().items():
                if key[0] == kind:
                    summed[key[1:]] = summed.get(key[1:], 0) + count
        return summed

    def _observe_moves(self, options: CallbackOptions) -> Iterable[Observation]:
        for (name, was, to), count in self._summed("moves").items():
            yield Observation(
                count,
                {
                    "chongming.task.name": name,
                    "chongming.task.from_status": was,
                    "chongming.task.status": to,
                },
            )

    def _observe_running(self, options: CallbackOptions) -> Iterable[Observation]:
        for (name,), count in self._summed("running").items():
            yield Observation(count, {"chongming.task.name": name})
