"""Fleet visibility: what no single node can see (docs/design.md, "Fleet declarations").

Every worker node declares itself in the store (``NodeRecord``: its buckets, its bucket
count, when it was last seen). ``examine()`` reads those declarations beside the tasks
and raises these alarms:

* ``duplicate-bucket``: a bucket declared by two live nodes (both may run its tasks);
* ``uncovered-bucket``: a bucket no live node declares, in a partitioned fleet (a node
  not cleanly stopped declared buckets; a fleet stopped on purpose expects nothing);
* ``num-buckets-mismatch``: live nodes (or the caller, where it names a count) disagree
  on the bucket count, so one ``bucket_key`` lands in different buckets;
* ``orphan``: a task not finished, unchanged for ``orphan_after`` seconds, in a bucket no
  live node looks after;
* ``stale-queued``: a task queued and unchanged for ``stale_after`` seconds, whoever
  covers it: the symptom every misconfiguration ends in;
* ``lease-expired``: a task not finished whose supervisor lease ran out: its node stopped
  renewing it, and ``reconcile`` would mark it ``lost``;
* ``node-unhealthy``: a live node says its store writes are failing or a service thread
  of it died (``NodeHealth``);
* ``desynced-runs``: a live node holds runs whose stored task another writer ended;
* ``late-report``: a task the store holds as ``lost`` (or otherwise ended) whose node
  later reported it finished: its work may be done, so do not simply re-run it;
* ``dead-node-tasks``: unfinished tasks of a node whose declaration expired (dead by the
  fleet's own rule, not cleanly stopped), delayed ones included, whose leases may run
  far past its death: none can run (the function lived in that process), and the
  owner of their bucket marks them ``lost`` at its next reconcile.

A node's long task that never checkpoints is none of these: its node renews its lease
and its bucket is covered. The declarations never decide who runs what.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import states
from .model import NodeRecord, TaskQuery, TaskScan, TaskSnapshot, TaskStatus
from .policies import DEFAULT_NUM_BUCKETS, format_buckets
from .stores.capabilities import Capabilities
from .stores.protocol import TaskStore

__all__ = [
    "DEFAULT_ORPHAN_AFTER",
    "DEFAULT_STALE_AFTER",
    "Alarm",
    "AlarmKind",
    "FleetReport",
    "NodeStatus",
    "bucket_alarms",
    "dead_node_alarms",
    "dead_nodes",
    "declared_buckets",
    "declared_count",
    "examine",
    "lease_expired",
    "node_alarms",
    "node_statuses",
]

DEFAULT_ORPHAN_AFTER = 600.0
"""Seconds a task must be unchanged, in an uncovered bucket, to be an orphan."""
DEFAULT_STALE_AFTER = 1800.0
"""Seconds a task may stay queued, unchanged, before it is reported."""


class AlarmKind(enum.StrEnum):
    DUPLICATE_BUCKET = "duplicate-bucket"
    EVERY_BUCKET_SHARED = "every-bucket-shared"
    UNCOVERED_BUCKET = "uncovered-bucket"
    NUM_BUCKETS_MISMATCH = "num-buckets-mismatch"
    ORPHAN = "orphan"
    STALE_QUEUED = "stale-queued"
    LEASE_EXPIRED = "lease-expired"
    NODE_UNHEALTHY = "node-unhealthy"
    DESYNCED_RUNS = "desynced-runs"
    LATE_REPORT = "late-report"
    DEAD_NODE_TASKS = "dead-node-tasks"


@dataclass(frozen=True, slots=True, kw_only=True)
class Alarm:
    kind: AlarmKind
    message: str
    buckets: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    task_ids: tuple[str, ...] = ()
    """The first tasks concerned (at most ``examine``'s ``limit``); ``count`` says all."""
    count: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """A node's declaration as seen at ``examine`` time."""

    record: NodeRecord
    live: bool
    seen_age: float
    """Seconds since the node was last seen."""
    active_tasks: int
    """Tasks it holds that are past ``queued`` and not finished (by supervisor lease)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetReport:
    checked_at: datetime
    num_buckets: int
    """The count judged by: the caller's, else the one the nodes declared
    (``num_buckets_declared``)."""
    nodes: tuple[NodeStatus, ...]
    alarms: tuple[Alarm, ...] = field(default=())
    registry: bool = True
    """Whether the store keeps node declarations at all (``False``: bucket alarms are
    unavailable, task alarms still hold)."""
    num_buckets_declared: bool = False
    """Whether ``num_buckets`` was read from the nodes' declarations."""

    @property
    def healthy(self) -> bool:
        return not self.alarms


def lease_expired(snapshot: TaskSnapshot, now: datetime) -> bool:
    """Whether a task not finished has no live supervisor lease (``reconcile`` would
    mark it ``lost``)."""
    return not snapshot.is_terminal and (
        snapshot.lease_until is None or snapshot.lease_until <= now
    )


def node_statuses(caps: Capabilities, now: datetime) -> list[NodeStatus]:
    """Every declared node, live or not, with its count of active tasks."""
    held = caps.count_tasks("lease_owner", statuses=states.ACTIVE)
    return [
        NodeStatus(
            record=r,
            live=r.is_live(now),
            seen_age=max(0.0, (now - r.seen_at).total_seconds()),
            active_tasks=held.get(r.node, 0),
        )
        for r in sorted(caps.nodes(), key=lambda r: r.node)
    ]


def declared_buckets(live: list[NodeRecord]) -> dict[int, list[str]]:
    """Each bucket some of ``live`` declare, with the nodes declaring it (in ``live``'s
    order; a node that declares no buckets, and so runs all, is in none)."""
    declared: dict[int, list[str]] = {}
    for r in live:
        for b in r.buckets or ():
            declared.setdefault(b, []).append(r.node)
    return declared


def declared_count(nodes: list[NodeRecord]) -> int | None:
    """The bucket count most of ``nodes`` declared (the larger on a tie); ``None`` when
    there are none. What a tool not told the count judges by."""
    counts = Counter(r.num_buckets for r in nodes)
    if not counts:
        return None
    return max(counts, key=lambda n: (counts[n], n))


def bucket_alarms(
    live: list[NodeRecord], num_buckets: int, *, expected: bool = True
) -> list[Alarm]:
    """What the live declarations say against each other: a bucket count other than
    ``num_buckets``, and buckets declared by two or more nodes (one alarm per set of
    nodes). ``expected=False``: the count was read from these declarations, so only their
    own disagreement is an alarm. ``examine`` raises these; a node's beacon logs them at
    start-up."""
    alarms: list[Alarm] = []
    if any(r.num_buckets != num_buckets for r in live):
        said = ", ".join(f"{r.node}={r.num_buckets}" for r in live)
        against = f"expected {num_buckets}, live nodes say" if expected else "live nodes say"
        alarms.append(
            Alarm(
                kind=AlarmKind.NUM_BUCKETS_MISMATCH,
                message=f"bucket counts disagree: {against} {said}; one bucket_key lands "
                "in different buckets",
                nodes=tuple(r.node for r in live if r.num_buckets != num_buckets),
            )
        )
    # Nodes that each declared every bucket are duplicate owners (said below); one that
    # declared no partition at all is said here, with the split that fixes it.
    everything = sorted(r.node for r in live if r.covers_all)
    if len(everything) > 1 and any(r.buckets is None for r in live if r.node in everything):
        alarms.append(_every_bucket_shared(everything, num_buckets))
    twice: dict[tuple[str, ...], list[int]] = {}
    for b, who in sorted(declared_buckets(live).items()):
        if len(who) > 1:
            twice.setdefault(tuple(sorted(who)), []).append(b)
    for names, buckets in twice.items():
        plural = "s" if len(buckets) > 1 else ""
        alarms.append(
            Alarm(
                kind=AlarmKind.DUPLICATE_BUCKET,
                message=f"bucket{plural} {format_buckets(buckets)} declared by "
                f"{' and '.join(names)}",
                buckets=tuple(buckets),
                nodes=names,
            )
        )
    return alarms


def _every_bucket_shared(names: list[str], num_buckets: int) -> Alarm:
    """Live nodes that each run every bucket: none owns a bucket, so what only an owner
    can hold does not hold across them. The fix named is a split of the buckets."""
    count = len(names)
    cuts = [at * num_buckets // count for at in range(count + 1)]
    split = [
        f"{name}: {format_buckets(range(cuts[at], cuts[at + 1]))}"
        for at, name in enumerate(names)
        if num_buckets >= count
    ]
    fix = f" (say {'; '.join(split)})" if split else ""
    return Alarm(
        kind=AlarmKind.EVERY_BUCKET_SHARED,
        message=f"{' and '.join(names)} each run every bucket: per-key and per-bucket "
        "limits count on each node, not fleet-wide, and a bucketed schedule has no one "
        f"owner; give each node its own owned_buckets{fix}",
        nodes=tuple(names),
    )


def examine(
    store: TaskStore | Capabilities,
    *,
    num_buckets: int | None,
    now: datetime | None = None,
    orphan_after: float = DEFAULT_ORPHAN_AFTER,
    stale_after: float = DEFAULT_STALE_AFTER,
    limit: int = 20,
) -> FleetReport:
    """Every alarm of the module's list, for the whole store (or its ``Capabilities``).
    ``now`` is the store's clock where it has one (``Capabilities.now``). ``num_buckets``
    ``None``: the count the live nodes declared (else the latest declarations', else
    ``DEFAULT_NUM_BUCKETS``), so a tool need not be told it."""
    caps = store if isinstance(store, Capabilities) else Capabilities(store)
    now = caps.now() if now is None else now
    nodes = node_statuses(caps, now)
    live = [n.record for n in nodes if n.live]
    declared_by_nodes = num_buckets is None
    if num_buckets is None:
        num_buckets = (
            declared_count(live)
            or declared_count([n.record for n in nodes if n.record.stopped_at is None])
            or DEFAULT_NUM_BUCKETS
        )
    alarms = bucket_alarms(live, num_buckets, expected=not declared_by_nodes)
    declared = set(declared_buckets(live))
    covers_all = any(r.covers_all for r in live)
    # A partitioned fleet: some node not cleanly stopped (live, or dead) declared buckets.
    # Then every bucket needs a live declarer; a fleet stopped on purpose needs none.
    partitioned = any(n.record.buckets is not None and n.record.stopped_at is None for n in nodes)
    if partitioned and not covers_all:
        gaps = [b for b in range(num_buckets) if b not in declared]
        if gaps:
            alarms.append(
                Alarm(
                    kind=AlarmKind.UNCOVERED_BUCKET,
                    message=f"no live node declares bucket(s) {format_buckets(gaps)}: "
                    "their tasks wait for nobody",
                    buckets=tuple(gaps),
                )
            )

    # The task alarms: each one question answered inside the store (a count and the
    # oldest few), so neither time nor memory grows with the store.
    def scan(**filters: Any) -> tuple[int, list[TaskSnapshot]]:
        return caps.scan_tasks(TaskScan(limit=limit, **filters))

    if not covers_all:
        alarms += _task_alarm(
            AlarmKind.ORPHAN,
            scan(
                statuses=states.NON_TERMINAL,
                outside=frozenset(declared),
                unchanged_since=now - timedelta(seconds=orphan_after),
            ),
            f"unchanged for over {orphan_after:g}s in buckets no live node declares",
        )
    alarms += _task_alarm(
        AlarmKind.STALE_QUEUED,
        scan(
            statuses=frozenset({TaskStatus.QUEUED}),
            unchanged_since=now - timedelta(seconds=stale_after),
        ),
        f"queued and unchanged for over {stale_after:g}s",
    )
    alarms += _task_alarm(
        AlarmKind.LEASE_EXPIRED,
        scan(statuses=states.NON_TERMINAL, lease_expired_at=now),
        "whose supervisor lease expired: their node stopped renewing it (reconcile marks "
        "them lost)",
    )
    alarms += node_alarms(live)
    alarms += dead_node_alarms(caps, nodes, now, limit=limit)
    reports = caps.late_reports(limit=limit)
    if reports:
        count = caps.count_late_reports()
        alarms.append(
            Alarm(
                kind=AlarmKind.LATE_REPORT,
                message=f"{count} task(s) the store ended without their node were later "
                "reported finished by it (`show` says how): the work may be done, do not "
                "simply re-run it",
                nodes=tuple(sorted({r.reported_by for r in reports})),
                task_ids=tuple(r.task_id for r in reports),
                count=count,
            )
        )
    return FleetReport(
        checked_at=now,
        num_buckets=num_buckets,
        nodes=tuple(nodes),
        alarms=tuple(alarms),
        registry=caps.has_fleet_registry,
        num_buckets_declared=declared_by_nodes,
    )


def dead_nodes(records: list[NodeRecord], now: datetime) -> list[NodeRecord]:
    """The nodes dead by the fleet's own rule at ``now``: declaration expired, never
    stopped (``doctor``'s ``dead-node-tasks``, and each reconcile's)."""
    return [r for r in records if r.stopped_at is None and not r.is_live(now)]


def dead_node_alarms(
    caps: Capabilities, nodes: list[NodeStatus], now: datetime, *, limit: int
) -> list[Alarm]:
    """One alarm per dead node that still has unfinished tasks (a count by owner, then
    the oldest ``limit`` of each such node)."""
    dead = dead_nodes([n.record for n in nodes], now)
    if not dead:
        return []
    counts = caps.count_tasks("owner", statuses=states.NON_TERMINAL)
    alarms: list[Alarm] = []
    for record in dead:
        count = counts.get(record.node, 0)
        if not count:
            continue
        tasks = caps.store.query(
            TaskQuery(owner=record.node, statuses=states.NON_TERMINAL, limit=limit, brief=True)
        )
        died = record.seen_at + timedelta(seconds=record.ttl_seconds)
        alarms.append(
            Alarm(
                kind=AlarmKind.DEAD_NODE_TASKS,
                message=f"node {record.node} is dead (its declaration expired at "
                f"{died:%Y-%m-%d %H:%M:%S} UTC) and holds {count} unfinished task(s), "
                "delayed ones included: none can run there (the function lived in that "
                "process); the owner of their buckets marks them lost at its next "
                "reconcile",
                nodes=(record.node,),
                task_ids=tuple(t.task_id for t in tasks),
                count=count,
            )
        )
    return alarms


def node_alarms(live: list[NodeRecord]) -> list[Alarm]:
    """What live nodes say of their own health: failing store writes or dead service
    threads, and runs the store has moved on from."""
    alarms: list[Alarm] = []
    for r in live:
        health = r.health
        if health is None:
            continue
        if not health.healthy:
            alarms.append(
                Alarm(
                    kind=AlarmKind.NODE_UNHEALTHY,
                    message=f"node {r.node}: " + "; ".join(health.problems()),
                    nodes=(r.node,),
                )
            )
        if health.desynced:
            alarms.append(
                Alarm(
                    kind=AlarmKind.DESYNCED_RUNS,
                    message=f"node {r.node} holds {health.desynced} run(s) whose stored task "
                    "another writer ended (lost by a reconcile while it was cut off, say)",
                    nodes=(r.node,),
                    count=health.desynced,
                )
            )
    return alarms


def _task_alarm(kind: AlarmKind, found: tuple[int, list[TaskSnapshot]], why: str) -> list[Alarm]:
    count, tasks = found
    if not count:
        return []
    buckets = sorted({s.bucket for s in tasks if s.bucket is not None})
    more = ", ..." if count > len(tasks) and buckets else ""
    where = f" (buckets {format_buckets(buckets)}{more})" if buckets else ""
    return [
        Alarm(
            kind=kind,
            message=f"{count} task(s) {why}{where}",
            buckets=tuple(buckets),
            nodes=tuple(sorted({s.lease_owner or s.owner or "-" for s in tasks})),
            task_ids=tuple(s.task_id for s in tasks),
            count=count,
        )
    ]
