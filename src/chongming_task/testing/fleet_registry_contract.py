"""The ``FleetRegistry`` section of the store contract: what nodes declare (themselves,
their schedules, their pipelines). Each test runs only where the store declares the
role whole, else raises ``unittest.SkipTest``."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ..health import NodeHealth, ServiceFault
from ..model import (
    NodeRecord,
    PipelineRecord,
    ScheduleRecord,
    TaskStatus,
)
from ..stores.roles import (
    FleetRegistry,
    Maintenance,
    SupportsStorageClock,
)
from .contract_base import ContractBase, at

__all__ = ["FleetRegistryContract"]


def _every_bucket(node: str) -> NodeRecord:
    """A node declaring every bucket, started and seen at ``at(0)``."""
    return NodeRecord(
        node=node,
        buckets=None,
        num_buckets=64,
        ttl_seconds=30.0,
        started_at=at(0),
        seen_at=at(0),
        host="h",
        pid=1,
    )


class FleetRegistryContract(ContractBase):
    def test_capability_node_registry_keeps_declarations(self) -> None:
        with self._store() as store:
            self._declares(store, FleetRegistry, "the node registry")
            assert isinstance(store, FleetRegistry)
            clock = store.storage_now if isinstance(store, SupportsStorageClock) else None

            def seen_near(record: NodeRecord, given: datetime) -> bool:
                # A store with its own clock writes its time, not the caller's.
                if clock is None:
                    return record.seen_at == given
                return abs((clock() - record.seen_at).total_seconds()) < 60

            def node(name: str) -> NodeRecord:
                found = [n for n in store.nodes() if n.node == name]
                assert len(found) == 1, f"{name}: {found}"
                return found[0]

            a = NodeRecord(
                node="node-a",
                buckets=frozenset({1, 2, 3}),
                num_buckets=64,
                ttl_seconds=30.0,
                started_at=at(0),
                seen_at=at(0),
                host="host-a",
                pid=101,
            )
            store.declare_node(a)
            store.declare_node(replace(a, node="node-b", buckets=None, num_buckets=8, pid=102))
            assert sorted(n.node for n in store.nodes()) == ["node-a", "node-b"]
            got = node("node-a")
            assert got.buckets == frozenset({1, 2, 3}) and got.num_buckets == 64
            assert got.ttl_seconds == 30.0 and got.host == "host-a" and got.pid == 101
            assert got.stopped_at is None and seen_near(got, at(0))
            b = node("node-b")
            assert b.buckets is None and b.num_buckets == 8  # no partition: every bucket
            store.declare_node(replace(a, buckets=frozenset({4})))  # buckets replaced
            assert node("node-a").buckets == frozenset({4})
            assert store.refresh_node("node-a", now=at(10)) is True
            assert seen_near(node("node-a"), at(10))
            assert store.refresh_node("nobody", now=at(10)) is False
            store.retire_node("node-a", now=at(20))
            retired = node("node-a")
            assert retired.stopped_at is not None and not retired.is_live(retired.seen_at)
            assert store.refresh_node("node-a", now=at(30)) is False  # declare again
            store.declare_node(replace(a, seen_at=at(40)))
            again = node("node-a")
            assert again.stopped_at is None and again.buckets == frozenset({1, 2, 3})

    def test_capability_node_registry_keeps_what_a_node_says_of_its_health(self) -> None:
        with self._store() as store:
            self._declares(store, FleetRegistry, "a node registry")
            assert isinstance(store, FleetRegistry)
            sick = NodeHealth(
                store_failing_since=at(3),
                store_failures=7,
                store_error="StoreError: database or disk is full",
                services=(ServiceFault(service="writer", deaths=2, error="OSError: x", at=at(4)),),
                unhealthy_services=("writer",),
                desynced=1,
            )
            store.declare_node(replace(_every_bucket("node-a"), health=sick))

            def health() -> NodeHealth | None:
                (got,) = store.nodes()
                return got.health

            assert health() == sick and not sick.healthy
            assert store.refresh_node("node-a", now=at(10)) is True
            assert health() == sick  # no health given: as it was
            assert store.refresh_node("node-a", now=at(20), health=NodeHealth()) is True
            assert health() == NodeHealth()

    def test_capability_node_pulse_refreshes_and_counts_the_commands_the_node_may_claim(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, FleetRegistry, "pulse_node()")
            assert isinstance(store, FleetRegistry)
            assert isinstance(store, FleetRegistry)
            record = _every_bucket("node-a")
            store.declare_node(record)
            assert store.pulse_node("node-a", now=at(10)) == 0
            (seen,) = store.nodes()
            assert seen.seen_at > record.seen_at  # refreshed (the store's clock, if any)
            for i in range(3):
                store.submit_command(self.command(f"c{i}", i, task_id=f"t{i}"))
            assert store.pulse_node("node-a", now=at(11), health=NodeHealth()) == 3
            assert store.nodes()[0].health == NodeHealth()
            # A claim's lease hides what it holds (a lease that outlives any clock here);
            # a finished command is no longer open.
            claimed = store.claim_commands(now=at(12), lease_seconds=10**9, limit=1)
            assert [c.command_id for c in claimed] == ["c0"]
            assert store.pulse_node("node-a", now=at(13)) == 2
            store.complete_command("c1", now=at(14), outcome="stopping")
            assert store.pulse_node("node-a", now=at(15)) == 1
            # Only what the node may claim: another node's running task's command wakes
            # that node alone; its own task's wakes it.
            store.declare_node(_every_bucket("node-b"))
            for task_id, holder in (("theirs", "node-b"), ("mine", "node-a")):
                store.create(self.snapshot(task_id, status=TaskStatus.RUNNING, lease_owner=holder))
                store.submit_command(self.command(f"c-{task_id}", 5, task_id=task_id))
            assert store.pulse_node("node-a", now=at(15)) == 2
            assert store.pulse_node("node-b", now=at(15)) == 2
            store.complete_command("c2", now=at(15), outcome="stopping")
            assert store.pulse_node("node-a", now=at(15)) == 1
            assert store.pulse_node("node-b", now=at(15)) == 1
            assert store.pulse_node("nobody", now=at(16)) is None
            store.retire_node("node-a", now=at(17))
            assert store.pulse_node("node-a", now=at(18)) is None  # declare again

    def test_capability_schedule_registry_keeps_records(self) -> None:
        with self._store() as store:
            self._declares(store, FleetRegistry, "the schedule registry")
            assert isinstance(store, FleetRegistry)

            def keys() -> list[tuple[str, str]]:
                return [(r.node, r.name) for r in store.schedules()]

            a = ScheduleRecord(
                node="node-a",
                name="nightly",
                task="etl.load",
                trigger="cron '0 2 * * *' (UTC)",
                updated_at=at(0),
                next_fire_at=at(100),
            )
            store.declare_schedule(a)
            store.declare_schedule(replace(a, node="node-b"))
            store.declare_schedule(replace(a, name="hourly", next_fire_at=None))
            assert keys() == [("node-a", "hourly"), ("node-a", "nightly"), ("node-b", "nightly")]
            fired = replace(
                a,
                next_fire_at=at(200),
                last_fired_at=at(100),
                last_task_id="t-1",
                fired=1,
                skipped=2,
                updated_at=at(100),
            )
            store.declare_schedule(fired)  # replaces node-a's record of that name
            assert [r for r in store.schedules() if r.name == "nightly"] == [
                fired,
                replace(a, node="node-b"),
            ]
            store.forget_schedule("node-a", "nightly")
            store.forget_schedule("node-a", "never-declared")
            assert keys() == [("node-a", "hourly"), ("node-b", "nightly")]

    def test_capability_pipeline_registry_keeps_run_shapes(self) -> None:
        with self._store() as store:
            self._declares(store, FleetRegistry, "the pipeline registry")
            assert isinstance(store, FleetRegistry)
            first = PipelineRecord(
                pipeline_run_id="run-1",
                name="etl",
                node="node-a",
                created_at=at(0),
                tasks={"extract": "t1", "transform": "t2", "load": "t3"},
                depends_on={"transform": ("extract",), "load": ("transform", "extract")},
            )
            second = replace(first, pipeline_run_id="run-2", name="étl ✓", created_at=at(5))
            store.record_pipeline(first)
            store.record_pipeline(second)
            got = store.pipeline_record("run-1")
            assert got is not None and got.tasks == first.tasks
            assert got.depends_on.get("load") == ("transform", "extract")
            assert got.depends_on.get("extract", ()) == ()
            assert got.created_at == at(0) and got.node == "node-a"
            assert store.pipeline_record("run-3") is None
            assert [r.pipeline_run_id for r in store.pipeline_records()] == ["run-2", "run-1"]
            assert [r.name for r in store.pipeline_records(limit=1)] == ["étl ✓"]

    def test_capability_pipeline_registry_record_goes_with_its_last_task(self) -> None:
        """Pruned by age or by count, a pipeline run's record goes once no task of it is
        left, never while one is (steady retention keeps the table as flat as tasks)."""
        with self._store() as store:
            self._declares(store, FleetRegistry, "the pipeline registry")
            assert isinstance(store, FleetRegistry)
            done, busy = TaskStatus.SUCCEEDED, TaskStatus.RUNNING
            layout = {"p-old": [done, done], "p-busy": [done, busy], "p-count": [done]}
            for n, (run, statuses) in enumerate(layout.items()):
                ids = {f"{run}-{i}": status for i, status in enumerate(statuses)}
                for i, (task_id, status) in enumerate(ids.items()):
                    ended = at(10 * n + i + 1) if status is done else None
                    store.create(
                        self.snapshot(
                            task_id,
                            status=status,
                            created_at=at(10 * n + i),
                            ended_at=ended,
                            pipeline_run_id=run,
                        )
                    )
                store.record_pipeline(
                    PipelineRecord(
                        pipeline_run_id=run,
                        name="etl",
                        node="node-a",
                        created_at=at(10 * n),
                        tasks={f"step{i}": task_id for i, task_id in enumerate(ids)},
                        depends_on={},
                    )
                )

            def runs() -> list[str]:
                return sorted(r.pipeline_run_id for r in store.pipeline_records())

            if isinstance(store, Maintenance):
                assert store.prune_ended(before=at(2), limit=1) == 1  # p-old-0 only
                assert runs() == ["p-busy", "p-count", "p-old"]
                assert store.prune_ended(before=at(15)) == 2  # p-old-1, p-busy-0
                assert runs() == ["p-busy", "p-count"]
            assert store.prune(keep_terminal=0) >= 1
            assert runs() == ["p-busy"]  # its running task holds it
            assert store.pipeline_record("p-busy") is not None
