"""``/metrics``: the store's state in Prometheus text format, read at each scrape with
the same index-answered questions as the CLI (never a task id as a label).

Gauges, because they are read from the store, not counted by this process: tasks by
status, unfinished tasks by bucket and status, tasks per bucket, lost tasks (the
``lost`` status is terminal: it only grows until ``prune``), nodes by state, alarms
firing by kind, the age of the oldest queued task. The dashboard's follower adds
counters of the transitions it saw (``_follow``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .. import fleet, present
from ..model import TaskStatus
from .follow import Follower

__all__ = ["Sources", "StoreCollector", "metrics_text", "store_registry"]


class Sources(Protocol):
    """What the gauges read: the follower's latest pass, and the store's clock."""

    follower: Follower

    def now(self) -> datetime: ...


class StoreCollector(Collector):
    def __init__(self, dashboard: Sources) -> None:
        self._d = dashboard

    def collect(self) -> Iterator[Metric]:
        d = self._d
        latest = d.follower.latest()  # read in the follower's thread, at most a pass old
        counts = latest.counts
        by_status = GaugeMetricFamily(
            "chongming_tasks", "Tasks in the store by status.", labels=["status"]
        )
        for status in TaskStatus:
            by_status.add_metric([status.value], counts.get(status, 0))
        yield by_status
        lost = GaugeMetricFamily("chongming_lost_tasks", "Tasks marked lost (result unknown).")
        lost.add_metric([], counts.get(TaskStatus.LOST, 0))
        yield lost
        per_bucket = GaugeMetricFamily(
            "chongming_bucket_tasks", "Tasks per bucket (any status).", labels=["bucket"]
        )
        totals = latest.bucket_totals
        for bucket in sorted(totals, key=_order):
            per_bucket.add_metric([_label(bucket)], totals[bucket])
        yield per_bucket
        unfinished = GaugeMetricFamily(
            "chongming_unfinished_tasks",
            "Unfinished tasks by bucket and status.",
            labels=["bucket", "status"],
        )
        pairs = latest.unfinished
        for bucket, status in sorted(pairs, key=lambda pair: (_order(pair[0]), pair[1].value)):
            unfinished.add_metric([_label(bucket), status.value], pairs[(bucket, status)])
        yield unfinished
        report = latest.report
        nodes = GaugeMetricFamily("chongming_nodes", "Declared nodes by state.", labels=["state"])
        states = {"live": 0, "dead": 0, "stopped": 0}
        for node in report.nodes:
            states[present.node_state(node).lower()] += 1
        for key, count in states.items():
            nodes.add_metric([key], count)
        yield nodes
        alarms = GaugeMetricFamily(
            "chongming_alarms", "Fleet alarms firing (doctor), by kind.", labels=["kind"]
        )
        firing = {kind.value: 0 for kind in fleet.AlarmKind}
        for alarm in report.alarms:
            firing[alarm.kind.value] += 1
        for kind, n in firing.items():
            alarms.add_metric([kind], n)
        yield alarms
        yield from _node_health(report)
        late = GaugeMetricFamily(
            "chongming_late_reports",
            "Tasks the store ended without their node that it later reported finished.",
        )
        late.add_metric(
            [],
            sum(a.count for a in report.alarms if a.kind is fleet.AlarmKind.LATE_REPORT),
        )
        yield late
        waited = GaugeMetricFamily(
            "chongming_oldest_queued_seconds", "Age of the oldest queued task (0: none)."
        )
        oldest = latest.oldest_queued
        waited.add_metric(
            [], 0.0 if oldest is None else max(0.0, (latest.at - oldest).total_seconds())
        )
        yield waited
        age = GaugeMetricFamily(
            "chongming_dashboard_read_age_seconds", "How old these store-wide figures are."
        )
        age.add_metric([], max(0.0, (d.now() - latest.at).total_seconds()))
        yield age


def _node_health(report: fleet.FleetReport) -> Iterator[Metric]:
    """What each live node says of its own health (nodes that say nothing: none)."""
    healthy = GaugeMetricFamily(
        "chongming_node_healthy",
        "1 while a live node says its store writes succeed and no service of it died.",
        labels=["node"],
    )
    failures = GaugeMetricFamily(
        "chongming_node_store_write_failures",
        "Store writes failed in a live node's current fault episode (0: none).",
        labels=["node"],
    )
    deaths = GaugeMetricFamily(
        "chongming_node_service_deaths",
        "Times a live node's service thread died and was started again.",
        labels=["node", "service"],
    )
    desynced = GaugeMetricFamily(
        "chongming_node_desynced_runs",
        "Runs a live node holds whose stored task another writer ended.",
        labels=["node"],
    )
    stalls = GaugeMetricFamily(
        "chongming_node_loop_stalls",
        "Times an async task blocked a live node's event loop (over about 100 ms).",
        labels=["node"],
    )
    workers = GaugeMetricFamily(
        "chongming_node_worker_processes",
        "A live node's worker processes for process tasks, busy or idle.",
        labels=["node", "state"],
    )
    started = GaugeMetricFamily(
        "chongming_node_worker_processes_started",
        "Worker processes a live node started, replacements included.",
        labels=["node"],
    )
    replaced = GaugeMetricFamily(
        "chongming_node_worker_processes_replaced",
        "Worker processes a live node started in place of one retired, ended or dead.",
        labels=["node"],
    )
    crashed = GaugeMetricFamily(
        "chongming_node_worker_processes_crashed",
        "A live node's worker processes that died on their own while carrying a task.",
        labels=["node"],
    )
    for n in report.nodes:
        health = n.record.health
        if not n.live or health is None:
            continue
        node = n.record.node
        healthy.add_metric([node], 1 if health.healthy else 0)
        failures.add_metric([node], health.store_failures)
        desynced.add_metric([node], health.desynced)
        stalls.add_metric([node], health.loop_stalls)
        for fault in health.services:
            deaths.add_metric([node, fault.service], fault.deaths)
        if health.processes is not None:
            workers.add_metric([node, "busy"], health.processes.busy)
            workers.add_metric([node, "idle"], health.processes.idle)
            started.add_metric([node], health.processes.started)
            replaced.add_metric([node], health.processes.replaced)
            crashed.add_metric([node], health.processes.crashed)
    yield from (healthy, failures, deaths, desynced, stalls, workers, started, replaced, crashed)


def _label(bucket: int | None) -> str:
    return "none" if bucket is None else str(bucket)


def _order(bucket: int | None) -> tuple[int, int]:
    return (1, 0) if bucket is None else (0, bucket)


def store_registry(dashboard: Sources) -> CollectorRegistry:
    """A registry whose scrape reads the store (the follower adds its counters to it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(dashboard))
    return registry


def metrics_text(registry: CollectorRegistry) -> tuple[bytes, str]:
    """One scrape: the body and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
