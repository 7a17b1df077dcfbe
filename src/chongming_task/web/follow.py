"""The dashboard's own follower: a thread that reads the store's transitions
(``TransitionFeed``) and counts them, for ``/metrics`` (transitions by move and task
name, task durations by name and outcome), and reads the store-wide aggregates (counts
by status and bucket, the fleet report, the tasks finished in the last ten minutes) that
the overview and ``/metrics`` show.

When to read: every ``interval`` (half a second), and on a store that notifies
(``subscribe_transitions``: Postgres's ``LISTEN``) also at once after a notification
(at most ``EAGER`` passes a second). The poll stays for progress moves (which notify
nobody), for writers that do not announce, and for notifications lost while the server
was away: a transition shows within a second either way, within a fifth of one when
notified. The aggregates are ``GROUP BY``s over the whole store (0.2 s at a million
tasks on SQLite, and 0.2 s more every ``CHART_EVERY`` for the finished tasks' chart),
read on their own beat, never by a request: it shows the latest, stamped
``Aggregates.at``. Counters start when the dashboard starts, as Prometheus counters do
after a restart; the aggregates are the store's, whoever wrote them and whenever the
dashboard started."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, Counter, Histogram

from .. import fleet
from ..clock import EPOCH
from ..errors import ChongmingTaskError
from ..feed import TransitionFeed
from ..loops import Pass, keep_running
from ..model import TaskScan, TaskStatus
from ..states import NON_TERMINAL, TERMINAL
from ..stores.capabilities import Capabilities

__all__ = ["Aggregates", "Finished", "Follower", "read_aggregates", "read_finished"]

log = logging.getLogger("chongming_task.web")

SLOT = timedelta(seconds=10)
"""Time per bar of the finished tasks' chart."""
SLOTS = 60
"""Bars: ten minutes."""
EAGER = 0.2
"""Seconds between two passes at least, however often the store notifies."""
CHART_EVERY = 5.0
"""Seconds between two reads of the finished tasks' chart at least: it reads the whole
table (0.21 s of a 0.39 s pass on SQLite at a million tasks: bench/scale.py), and its
bars are 10 s wide."""
DURATIONS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)


@dataclass(frozen=True, slots=True)
class Aggregates:
    """The store as a whole at ``at`` (the store's clock)."""

    at: datetime
    counts: dict[TaskStatus, int]
    bucket_totals: dict[int | None, int]
    unfinished: dict[tuple[int | None, TaskStatus], int]
    report: fleet.FleetReport
    oldest_queued: datetime | None
    finished: Finished


@dataclass(frozen=True, slots=True)
class Finished:
    """The tasks that ended in the ``SLOTS`` slots from ``since`` (the last slot holds
    ``at``), per ``(slot, status)``, as the store counts them (``Maintenance``)."""

    since: datetime
    at: datetime
    counts: dict[tuple[int, TaskStatus], int]


def read_finished(caps: Capabilities) -> Finished:
    now = caps.now()
    since = _slot_start(now) - SLOT * (SLOTS - 1)
    return Finished(since, now, caps.ended_timeline(since=since, width=SLOT))


def read_aggregates(
    caps: Capabilities, num_buckets: int | None, *, finished: Finished | None = None
) -> Aggregates:
    """The store-wide aggregates; ``finished`` is kept if given (else read too)."""
    now = caps.now()
    _, oldest = caps.scan_tasks(TaskScan(statuses=frozenset({TaskStatus.QUEUED}), limit=1))
    return Aggregates(
        at=now,
        counts=caps.store.counts(),
        bucket_totals=caps.count_tasks("bucket"),
        unfinished=caps.count_tasks("bucket_status", statuses=NON_TERMINAL),
        report=fleet.examine(caps, num_buckets=num_buckets, now=now, limit=5),
        oldest_queued=oldest[0].created_at if oldest else None,
        finished=finished or read_finished(caps),
    )


def _slot_start(at: datetime) -> datetime:
    """The start of the ``SLOT`` that holds ``at`` (slots aligned on the epoch)."""
    return at - (at - EPOCH) % SLOT


class Follower:
    def __init__(
        self,
        caps: Capabilities,
        registry: CollectorRegistry,
        *,
        num_buckets: int | None,
        interval: float = 0.5,
    ) -> None:
        self.interval = interval
        self._caps = caps
        self._num_buckets = num_buckets
        self._latest: Aggregates | None = None
        self._chart_due = 0.0  # when the finished tasks' chart is read again (monotonic)
        self.version = 0
        """Bumped by each pass that saw a transition or a progress move: what the event
        stream (``/events``) tells open pages."""
        self._feed = TransitionFeed(caps.store)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a notification, or stop()
        self._unsubscribe: Callable[[], None] | None = None
        self.notified = False
        """Whether the store notifies this follower of transitions (else it polls)."""
        self._thread: threading.Thread | None = None
        self.transitions = Counter(
            "chongming_transitions",
            "Transitions seen by this dashboard since it started, by move and task name.",
            ["from_status", "to_status", "name"],
            registry=registry,
        )
        self.command_latency = Histogram(
            "chongming_command_latency_seconds",
            "From a control's command being written to its holder finishing it (commands "
            "finished since this dashboard started), by action and outcome.",
            ["action", "outcome"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self._commands_after: datetime | None = None
        self.durations = Histogram(
            "chongming_task_duration_seconds",
            "Start to end of tasks that finished since this dashboard started.",
            ["name", "outcome"],
            buckets=DURATIONS,
            registry=registry,
        )

    def start(self) -> None:
        self._feed.poll()  # from now on
        self._commands_after = self._caps.now()
        self.refresh()
        self._unsubscribe = self._caps.subscribe_transitions(self._wake.set)
        self.notified = self._unsubscribe is not None
        name = "chongming-web-follow"
        target = keep_running(name, self._run, stopping=self._stop.is_set)
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        clock = time.monotonic
        next_poll = next_refresh = clock() + self.interval
        while True:
            self._wake.wait(max(0.0, min(next_poll, next_refresh) - clock()))
            if self._stop.is_set():
                return
            self._wake.clear()  # a notification from now on wakes the next pass
            started = clock()
            next_poll = started + self.interval
            try:
                self.run_once()
                if started >= next_refresh:
                    self.refresh()
                    # A store so large that reading the aggregates takes long is read
                    # less often: they use at most a third of a core.
                    next_refresh = clock() + max(self.interval, 2 * (clock() - started))
            except ChongmingTaskError as exc:
                log.warning("dashboard follower: %s", exc)
            except Exception:  # a bug must not end the thread: the pages would go stale
                log.exception("dashboard follower failed a pass; trying again")
            self._stop.wait(max(0.0, EAGER - (clock() - started)))

    def refresh(self) -> Aggregates:
        last, now = self._latest, time.monotonic()
        kept = last.finished if last is not None and now < self._chart_due else None
        if kept is None:
            self._chart_due = now + CHART_EVERY
        self._latest = read_aggregates(self._caps, self._num_buckets, finished=kept)
        return self._latest

    def latest(self) -> Aggregates:
        """The newest aggregates (read now if none was read yet)."""
        return self._latest or self.refresh()

    def run_once(self) -> Pass:
        """One pass: the commands finished and the transitions made since the last,
        counted; ``done``: the transitions seen."""
        self._count_commands()
        change = self._feed.poll()
        if change.transitions or change.progressed:
            self.version += 1
        for t in change.transitions:
            s = change.tasks.get(t.task_id)
            name = s.name if s is not None else "?"
            source = t.from_status.value if t.from_status else "new"
            self.transitions.labels(source, t.to_status.value, name).inc()
            if t.to_status in TERMINAL and s is not None and s.started_at and s.ended_at:
                took = max(0.0, (s.ended_at - s.started_at).total_seconds())
                self.durations.labels(name, t.to_status.value).observe(took)
        return Pass(done=len(change.transitions))

    def _count_commands(self) -> None:
        if self._commands_after is None:
            self._commands_after = self._caps.now()
        for c in self._caps.commands.finished(after=self._commands_after):
            if c.finished_at is None:
                continue
            took = max(0.0, (c.finished_at - c.created_at).total_seconds())
            self.command_latency.labels(c.action.value, c.outcome or "none").observe(took)
            self._commands_after = max(self._commands_after, c.finished_at)
