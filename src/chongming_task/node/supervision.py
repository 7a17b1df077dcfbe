"""Supervision: the loop that keeps a node's tasks honest in the store, and reconcile.

``Supervisor`` is the node's background pass over its duties, each a small service of
its own (``run_once(now)`` returns what it did): ``LeaseRenewal`` (first: after an outage
these are the writes that keep other nodes' ``reconcile()`` off live tasks),
``RetryRelease``, ``ActivityFlush`` (progress and heartbeats through ``touch``),
``TimeoutCheck`` and ``WriteCatchUp``. ``Reconciler`` marks ``lost`` the tasks whose
supervisor lease expired, in the node's own buckets, and lets go of any whose version
moved (its supervisor is alive after all). Neither holds a reference to the controller: each gets
its collaborators handed in.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from .. import states
from ..current import running
from ..errors import StoreError, StoreUnavailable
from ..fleet import dead_nodes
from ..late import LateReport
from ..model import Failure, FailureKind, NodeRecord, Progress, TaskQuery, TaskScan, TaskSnapshot
from ..stores.capabilities import lost_mark
from .services import LoopService, NodeContext, Pass
from .submission import end_doubtful

if TYPE_CHECKING:
    from ..run.life import Run
    from ..stores.roles import Activity
    from .dispatch import Dispatcher

__all__ = [
    "ActivityFlush",
    "DoubtfulCreates",
    "Duty",
    "LateReporting",
    "LeaseRenewal",
    "ReconcileLoop",
    "ReconcileReport",
    "Reconciler",
    "RetryRelease",
    "Supervisor",
    "TimeoutCheck",
    "WriteCatchUp",
]

log = logging.getLogger("chongming_task.supervision")


class Duty(Protocol):
    """One of the supervisor's duties: a pass at monotonic ``now``, what it did."""

    name: str

    def run_once(self, now: float) -> Pass: ...


class LeaseRenewal:
    """Renew the leases that have used a third of their TTL, in one statement or one
    transaction where the store offers one (a fresh backlog of queued tasks costs
    nothing here). If that fails, each lease is renewed on its own, so one task's fault
    never costs another task its lease. Runs at most every sixth of the TTL (a second at
    most), and again on the very next pass while any due lease is not renewed."""

    name = "lease renewal"

    def __init__(self, node: NodeContext, *, lease_ttl: float, reachable: Callable[[], None]):
        self._owner = node.owner
        self._registry = node.registry
        self._caps = node.capabilities
        self._store = node.capabilities.store
        self._clock = node.clock
        self._leases = node.leases
        self._lease_ttl = lease_ttl
        self._reachable = reachable
        self._faults = node.health.faults
        self._next = 0.0  # monotonic time of the next renewal

    def run_once(self, now: float) -> Pass:
        if now < self._next:
            return Pass()
        self._next = now  # until it completes: tried again on the very next pass
        renewed, complete = self.renew(now)
        if complete:
            self._next = now + min(1.0, self._lease_ttl / 6)
        return Pass(done=renewed)

    def renew(self, mono: float) -> tuple[int, bool]:
        """(leases renewed, whether every due lease was)."""
        due = [
            run
            for run in self._registry.leased(mono)
            if not run.done() and not run.desynced and run.lease_due(mono)
        ]
        if not due:
            return 0, True
        # Lease time: the store's clock where it has one, read again once its reading is
        # a minute old (on failure the last reading holds: it drifts by milliseconds).
        try:
            self._leases.sync()
        except StoreUnavailable:
            raise
        except Exception:
            log.exception("store clock not read; the last measured offset holds")
        until = self._leases.now() + timedelta(seconds=self._lease_ttl)
        store, owner = self._store, self._owner
        renewed = due
        try:
            granted = self._caps.renew_leases(
                [run.task_id for run in due], owner=owner, until=until
            )
        except StoreUnavailable:
            raise
        except Exception:
            renewed = []
            for run in due:
                try:
                    store.touch(run.task_id, lease_owner=owner, lease_until=until)
                except StoreUnavailable:
                    raise
                except StoreError as exc:
                    self._faults.failed(f"lease of task {run.task_id}", exc)
                except Exception:
                    with running(run):
                        log.exception("task %s: lease not renewed; will retry", run.task_id)
                else:
                    renewed.append(run)
        else:
            if granted is not None:  # the store said which: the others are not ours now
                renewed = [run for run in due if run.task_id in granted]
                for run in due:
                    if run.task_id not in granted:
                        run.writes.refuse("lease renewal")
        self._reachable()
        for run in renewed:
            run.lease_renewed(mono + self._lease_ttl / 3)
        return len(renewed), len(renewed) == len(due)


class RetryRelease:
    """Move the retries whose backoff has passed to the ready queue (the workers do it
    too when they look for work; this notices a fake clock's advance)."""

    name = "retry release"

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    def run_once(self, now: float) -> Pass:
        return Pass(done=self._dispatcher.release_due())


HEARTBEAT_EVERY = 5.0
"""Seconds between two writes of a task's heartbeat alone: a progress move is written at
the next pass, a checkpoint that only says "alive" at most this often. A node running
100 tasks that checkpoint all the time wrote their heartbeats 3 times a second; now once
every 5 s (bench/idle_node.py's busy row)."""


class ActivityFlush:
    """Progress and heartbeats go to the store beside the version (never ``save``), all
    of a pass in one call where the store can. A task whose row the store refuses
    (finished, or another node's) is desynced at once."""

    name = "activity flush"

    def __init__(self, node: NodeContext, *, reachable: Callable[[], None]) -> None:
        self._registry = node.registry
        self._owner = node.owner
        self._caps = node.capabilities
        self._reachable = reachable
        self._faults = node.health.faults
        self._written: dict[str, tuple[Progress | None, float]] = {}
        """Per task: the progress last written, and when (monotonic)."""

    def run_once(self, now: float) -> Pass:
        readings: list[tuple[Run, int]] = []
        items: list[Activity] = []
        previous = self._written
        fresh: dict[str, tuple[Progress | None, float]] = {}
        active = self._registry.active()
        for run in active:
            if run.desynced:
                continue
            activity = run.unflushed_activity()
            if activity is None:
                continue
            seq, progress, heartbeat = activity
            last = previous.get(run.task_id)
            if last is not None and progress == last[0] and now - last[1] < HEARTBEAT_EVERY:
                continue  # a heartbeat alone, written not long ago: it waits
            fresh[run.task_id] = (progress, now)
            readings.append((run, seq))
            items.append((run.task_id, progress, heartbeat))
        if len(previous) > 2 * len(active) + 100:  # forget the tasks that ended
            held = {run.task_id for run in active}
            self._written = {k: v for k, v in previous.items() if k in held}
        if not items:
            return Pass()
        try:
            written = self._caps.write_activity(items, owner=self._owner)
        except StoreUnavailable:
            raise  # nobody's activity can be written now: end the step
        except Exception:
            refused = self._one_by_one(readings, items)
        else:
            refused = set() if written is None else {i[0] for i in items} - written
        self._written.update(fresh)
        self._reachable()
        for run, seq in readings:
            if run.task_id in refused:
                run.writes.refuse("progress/heartbeat write")
            run.activity_flushed(seq)
        return Pass(done=len(items) - len(refused))

    def _one_by_one(self, readings: list[tuple[Run, int]], items: list[Activity]) -> set[str]:
        """After a failed batch: each task's activity on its own, so one task's values
        cost the others nothing. Returns the ids the store refused."""
        refused: set[str] = set()
        for (run, _), item in zip(readings, items, strict=True):
            try:
                written = self._caps.write_activity([item], owner=self._owner)
            except StoreUnavailable:
                raise
            except Exception as exc:
                # checkpoint() checks the values, so this is a store fault: drop this
                # reading, keep flushing the others.
                self._faults.failed(f"progress of task {run.task_id}", exc)
            else:
                if written is not None and run.task_id not in written:
                    refused.add(run.task_id)
        return refused


class TimeoutCheck:
    """Tell a timed-out task to stop, and abandon one that ignored it for its grace;
    each task checked on its own, so one task's fault costs the others nothing."""

    name = "timeout check"

    def __init__(self, node: NodeContext) -> None:
        self._registry = node.registry

    def run_once(self, now: float) -> Pass:
        acted = 0
        for run in self._registry.active():
            try:
                acted += run.check_timeout(now)
            except Exception:
                with running(run):
                    log.exception("task %s: timeout check failed; continuing", run.task_id)
        return Pass(done=acted)


class DoubtfulCreates:
    """Resolve, by id, the creates that failed with the store away (docs/design.md, "A
    commit nobody heard"): one that landed after all was never started, since its caller
    was told it failed, and is ended ``cancelled`` (``NEVER_STARTED``), never left to
    become ``lost``. The store still away ends the pass; the rest wait for the next."""

    name = "doubtful creates"

    def __init__(self, node: NodeContext) -> None:
        self._owner = node.owner
        self._now = node.now
        self._registry = node.registry
        self._caps = node.capabilities

    def run_once(self, now: float) -> Pass:
        ended: list[str] = []
        for snapshot in self._registry.doubtful():
            outcome = end_doubtful(
                self._caps, self._registry, snapshot, now=self._now(), actor=self._owner
            )
            if outcome == "cancelled":
                ended.append(snapshot.task_id)
        if ended:
            log.warning(
                "node %s: %d task(s) whose submit was reported as failed had been stored "
                "after all (the store went away before acknowledging the commit); ended "
                "cancelled, never started: %s",
                self._owner,
                len(ended),
                ", ".join(ended[:5]) + (" ..." if len(ended) > 5 else ""),
            )
        return Pass(done=len(ended))


class WriteCatchUp:
    """Retry the buffered writes of runs that are behind in the store."""

    name = "write-through catch-up"

    def __init__(self, node: NodeContext) -> None:
        self._registry = node.registry

    def run_once(self, now: float) -> Pass:
        registry = self._registry
        behind = registry.take_behind()
        caught = 0
        for i, run in enumerate(behind):
            if run.catch_up():
                caught += 1
                if run.done():
                    registry.ended(run, written=True)
            elif not run.desynced:
                registry.mark_behind(run.task_id)
                if isinstance(run.write_error, StoreUnavailable):
                    # The store is away for everyone: the rest wait for the next pass.
                    for rest in behind[i + 1 :]:
                        registry.mark_behind(rest.task_id)
                    raise run.write_error
        return Pass(done=caught)


class LateReporting:
    """Keep the late report of each desynced run that ended here beside its task: its
    end as this process saw it, never a change of the stored status (docs/design.md,
    "Late truth"). A report the store could not take is tried again next pass."""

    name = "late reports"

    def __init__(self, node: NodeContext) -> None:
        self._owner = node.owner
        self._now = node.now
        self._registry = node.registry
        self._caps = node.capabilities
        self._faults = node.health.faults

    def run_once(self, now: float) -> Pass:
        ended = self._registry.take_late()
        kept = 0
        for i, local in enumerate(ended):
            try:
                stored = self._caps.store.get(local.task_id)
                if stored is None:
                    log.warning("task %s: ended here, no longer in the store", local.task_id)
                    continue
                report = LateReport(
                    task_id=local.task_id,
                    reported_by=self._owner,
                    reported_at=self._now(),
                    status=local.status,
                    stored_status=stored.status,
                    ended_at=local.ended_at,
                    outcome=local.outcome,
                    failure=local.failure,
                )
                recorded = self._caps.record_late_report(report)
            except StoreError:
                for rest in ended[i:]:
                    self._registry.report_late(rest)
                raise
            kept += 1
            log.warning(
                "task %s: %s%s",
                local.task_id,
                report.summary(),
                "; kept beside it as a late report" if recorded else "",
            )
        return Pass(done=kept)


class Supervisor(LoopService):
    """One node's supervision: its duties, in order, every ``interval`` seconds, on one
    thread. Lease renewal comes first: after an outage these are the writes that keep
    other nodes' ``reconcile()`` off live tasks."""

    def __init__(
        self, node: NodeContext, *, dispatcher: Dispatcher, lease_ttl: float, interval: float
    ) -> None:
        super().__init__()
        self.name = f"chongming-supervisor[{node.owner}]"
        self.interval = interval
        self._clock = node.clock
        self._faults = node.health.faults
        self.doubtful = DoubtfulCreates(node)
        """Also run once by the node's close."""
        self.duties: tuple[Duty, ...] = (
            LeaseRenewal(node, lease_ttl=lease_ttl, reachable=self._reachable),
            RetryRelease(dispatcher),
            ActivityFlush(node, reachable=self._reachable),
            TimeoutCheck(node),
            WriteCatchUp(node),
            self.doubtful,
            LateReporting(node),
        )

    def run_once(self, now: float | None = None) -> Pass:
        """One pass. Every duty, and every task within one, is isolated: one task's store
        error is logged for that task and costs no other task its lease, timeout check or
        progress. A store that is unreachable (``StoreUnavailable``) ends a duty at once,
        so a pass stays short during an outage. ``now`` is monotonic time (the clock's
        when ``None``); ``done`` counts what every duty did."""
        if now is None:
            now = self._clock.monotonic()
        done = 0
        for duty in self.duties:
            try:
                done += duty.run_once(now).done
            except StoreError as exc:  # unreachable, full, read-only...: one line
                self._faults.failed(duty.name, exc)
            except Exception:
                log.exception("supervisor %s failed; continuing", duty.name)
        self._faults.check()
        return Pass(done=done)

    def _reachable(self) -> None:
        """A store write of a duty succeeded (the fault, if any, ends once none fails
        for a few seconds: ``FaultLog``)."""
        self._faults.succeeded()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileReport:
    """What ``reconcile()`` did (or, with ``dry_run``, would do)."""

    dry_run: bool
    examined: int
    lost: tuple[str, ...]
    let_go: tuple[str, ...]
    """Tasks whose version moved under reconcile: their supervisor is alive after all."""


class Reconciler:
    """Marks ``lost`` the tasks whose supervisor lease expired, in ``buckets`` only
    (``None``: every bucket), never a task this node holds."""

    def __init__(self, node: NodeContext, *, buckets: frozenset[int] | None) -> None:
        self._owner = node.owner
        self._registry = node.registry
        self._caps = node.capabilities
        self._leases = node.leases
        self._buckets = buckets
        self._verdicts: dict[str | None, tuple[Failure, str]] = {}

    @property
    def buckets(self) -> frozenset[int] | None:
        """The buckets it acts on (``None``: every task, bucketless ones included)."""
        return self._buckets

    @property
    def scope(self) -> str:
        """The buckets reconciled, in words."""
        if self._buckets is None:
            return "every bucket"
        return f"{len(self._buckets)} owned bucket(s)"

    def run(self, *, dry_run: bool = False) -> ReconcileReport:
        """Never re-executes anything (the store holds states, not arguments). A version
        conflict means the supervisor came back: reconcile lets go of that task."""
        self._leases.sync()  # expired by the store's clock where it has one
        now = self._leases.now()
        held = frozenset(self._registry.held_ids())
        # The judgement is the store's query: only the expired are read or marked.
        scan = TaskScan(
            statuses=states.LOSABLE, buckets=self._buckets, lease_expired_at=now, limit=None
        )
        if dry_run:
            _, expired = self._caps.scan_tasks(scan)
            candidates = [s.task_id for s in expired if s.task_id not in held]
            candidates += [s.task_id for s, _ in self._of_dead_nodes(now, held)]
            candidates = list(dict.fromkeys(candidates))
            return ReconcileReport(
                dry_run=True, examined=len(candidates), lost=tuple(candidates), let_go=()
            )
        lost, let_go = self._caps.mark_expired_lost(
            scan, exclude=held, at=now, actor=self._owner, verdict=self.verdict
        )
        # Then the dead nodes' tasks whose leases run on (delayed ones): a CAS each.
        marks = [
            lost_mark(s, now, self._owner, _dead_verdict(record, s, now))
            for s, record in self._of_dead_nodes(now, held | set(lost) | set(let_go))
        ]
        if marks:
            won = self._caps.mark_lost(marks)
            lost = [*lost, *(m.task_id for m, _ in marks if m.task_id in won)]
            let_go = [*let_go, *(m.task_id for m, _ in marks if m.task_id not in won)]
        return ReconcileReport(
            dry_run=False,
            examined=len(lost) + len(let_go),
            lost=tuple(lost),
            let_go=tuple(let_go),
        )

    def _of_dead_nodes(
        self, now: datetime, exclude: frozenset[str] | set[str]
    ) -> list[tuple[TaskSnapshot, NodeRecord]]:
        """The unfinished tasks, in this reconciler's buckets, of the nodes dead by the
        fleet's own rule (declaration expired, never stopped): their leases may run far
        past the death (a delayed task's runs to its time), yet nothing can run them
        (docs/design.md, "Reconcile"). None where the store keeps no declarations."""
        found: list[tuple[TaskSnapshot, NodeRecord]] = []
        for record in dead_nodes(self._caps.nodes(), now):
            if record.node == self._owner:
                continue
            query = TaskQuery(
                owner=record.node, statuses=states.LOSABLE, buckets=self._buckets, brief=True
            )
            found += [
                (s, record) for s in self._caps.store.query(query) if s.task_id not in exclude
            ]
        return found

    def verdict(self, owner: str | None) -> tuple[Failure, str]:
        """The failure and trail reason of the tasks whose lease ``owner`` let expire
        (one per owner per reconcile; the lease's own expiry stays on the snapshot)."""
        found = self._verdicts.get(owner)
        if found is None:
            expired = f"supervisor lease of {owner or 'nobody'} expired"
            failure = Failure(
                kind=FailureKind.LOST,
                # One verdict per owner covers tasks stored as started and as waiting;
                # a waiting one ran only if its node's writes were failing, so say "if".
                message=f"{expired}; result unknown: if the task had started, it may have "
                "run partly or fully and may still be running",
                carrier_may_run=True,
            )
            found = self._verdicts[owner] = (failure, f"reconcile: {expired}")
        return found


def _dead_verdict(
    record: NodeRecord, s: TaskSnapshot, now: datetime
) -> Callable[[str | None], tuple[Failure, str]]:
    """The verdict on a dead node's task: the node, when it died, and the time a delayed
    task was waiting for."""
    died = record.seen_at + timedelta(seconds=record.ttl_seconds)
    dead = f"node {record.node} died (its declaration expired at {died:%Y-%m-%d %H:%M:%S} UTC)"
    if s.status in states.WAITING and s.run_at is not None and s.run_at > died:
        message = (
            f"{dead} before the task's run time {s.run_at:%Y-%m-%d %H:%M:%S} UTC: it never "
            "started, and no other node holds its function; had the node only been cut "
            "off, it may still run it"
        )
    elif s.status in states.WAITING:
        message = (
            f"{dead} while the task waited: it had not started, and no other node holds "
            "its function; had the node only been cut off, it may still run it"
        )
    else:
        message = (
            f"{dead}; result unknown: the task had started, and may have run partly or fully "
            "and may still be running"
        )
    started = s.status not in states.WAITING  # one that never started runs nowhere now
    found = (
        Failure(kind=FailureKind.LOST, message=message, carrier_may_run=started),
        f"reconcile: node {record.node} dead",
    )
    return lambda _lease_owner: found


class ReconcileLoop(LoopService):
    """Each node's own restart recovery: ``reconcile()`` of its buckets at start, then
    about once every ``interval`` seconds (a tenth either way, so a fleet started
    together does not scan together). A replacement node started with a dead node's
    buckets marks its tasks ``lost`` once their leases expire, with no human; the lease
    rules keep it off every live node's tasks (docs/design.md, "Reconcile")."""

    def __init__(
        self, node: NodeContext, reconciler: Reconciler, *, interval: float, rng: random.Random
    ) -> None:
        super().__init__()
        self.name = f"chongming-reconcile[{node.owner}]"
        self.interval = interval
        self._reconciler = reconciler
        self._rng = rng

    def run_once(self, now: float | None = None) -> Pass:
        wait = self.interval * self._rng.uniform(0.9, 1.1)
        try:
            report = self._reconciler.run()
        except StoreUnavailable as exc:
            log.debug("reconcile: %s", exc)  # the supervisor reports the outage
            return Pass(wait=wait)
        if report.lost:
            shown = ", ".join(report.lost[:5]) + (" ..." if len(report.lost) > 5 else "")
            log.warning(
                "reconcile of %s: %d task(s) lost, their supervisor's lease expired: %s",
                self._reconciler.scope,
                len(report.lost),
                shown,
            )
        return Pass(done=len(report.lost), wait=wait)
