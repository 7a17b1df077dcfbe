"""The dashboard's own follower: a thread that reads the store's transitions once a
second (``TransitionFeed``) and counts them, for ``/metrics`` (transitions by move and
task name, task durations by name and outcome) and the overview's throughput chart.
Counters start when the dashboard starts, as Prometheus counters do after a restart."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram

from .._feed import TransitionFeed
from ..errors import ChongmingTaskError
from ..model import TaskStatus
from ..states import TERMINAL
from ..stores.protocol import TaskStore

__all__ = ["Follower"]

log = logging.getLogger("chongming_task.web")

SLOT = 10.0
"""Seconds per bar of the throughput chart."""
SLOTS = 60
"""Bars kept: ten minutes."""
DURATIONS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)


class Follower:
    def __init__(self, store: TaskStore, registry: CollectorRegistry, interval: float = 1.0):
        self.interval = interval
        self._feed = TransitionFeed(store)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finished: deque[tuple[float, dict[str, int]]] = deque(maxlen=SLOTS)
        self.transitions = Counter(
            "chongming_transitions",
            "Transitions seen by this dashboard since it started, by move and task name.",
            ["from_status", "to_status", "name"],
            registry=registry,
        )
        self.durations = Histogram(
            "chongming_task_duration_seconds",
            "Start to end of tasks that finished since this dashboard started.",
            ["name", "outcome"],
            buckets=DURATIONS,
            registry=registry,
        )

    def start(self) -> None:
        self._feed.poll()  # from now on
        self._thread = threading.Thread(target=self._run, name="chongming-web-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.once()
            except ChongmingTaskError as exc:
                log.warning("dashboard follower: %s", exc)

    def once(self) -> None:
        change = self._feed.poll()
        ended: dict[str, int] = {}
        for t in change.transitions:
            s = change.tasks.get(t.task_id)
            name = s.name if s is not None else "?"
            source = t.from_status.value if t.from_status else "new"
            self.transitions.labels(source, t.to_status.value, name).inc()
            if t.to_status in TERMINAL:
                ended[t.to_status.value] = ended.get(t.to_status.value, 0) + 1
                if s is not None and s.started_at is not None and s.ended_at is not None:
                    took = max(0.0, (s.ended_at - s.started_at).total_seconds())
                    self.durations.labels(name, t.to_status.value).observe(took)
        now = time.time()
        slot = now - now % SLOT
        with self._lock:
            if self._finished and self._finished[-1][0] == slot:
                counts = self._finished[-1][1]
                for status, n in ended.items():
                    counts[status] = counts.get(status, 0) + n
            else:
                self._finished.append((slot, ended))

    def throughput(self) -> list[tuple[float, dict[str, int]]]:
        """Tasks finished per ``SLOT`` seconds, by outcome, oldest first (gaps filled)."""
        now = time.time()
        newest = now - now % SLOT
        with self._lock:
            seen = dict(self._finished)
        return [
            (slot, seen.get(slot, {}))
            for slot in (newest - SLOT * k for k in range(SLOTS - 1, -1, -1))
        ]


OUTCOMES = [
    s.value
    for s in (
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.STOPPED,
        TaskStatus.CANCELLED,
        TaskStatus.LOST,
    )
]
