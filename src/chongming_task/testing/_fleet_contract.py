"""The capability contract's fleet half: what a store keeps for the nodes and tools of a
fleet (declarations, schedules, pipeline shapes, the command log, pending commands, the
store's clock, wake-ups), each run only where the store declares it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from unittest import SkipTest

from ..health import NodeHealth, ServiceFault
from ..late import LateReport
from ..model import (
    CommandAction,
    Failure,
    FailureKind,
    NodeRecord,
    PipelineRecord,
    ScheduleRecord,
    TaskStatus,
)
from ..stores.capabilities import (
    CommandChannel,
    FleetRegistry,
    Maintenance,
    SupportsStorageClock,
)
from ._contract_base import ContractBase, at

__all__ = ["FleetCapabilityContract"]


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


class FleetCapabilityContract(ContractBase):
    def test_capability_command_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_commands()")
            assert isinstance(store, CommandChannel)
            woke = threading.Event()
            unsubscribe = store.subscribe_commands(woke.set)
            if unsubscribe is None:
                raise SkipTest(f"{type(store).__name__} cannot wake a subscriber here")
            try:
                # The subscription may take a moment to start (and may wake once when it
                # does): keep submitting a while.
                for i in range(40):
                    store.submit_command(self.command(f"wake-{i}", i))
                    if woke.wait(0.25):
                        break
                assert woke.is_set(), "no wake-up within 10 s of submitting commands"
                time.sleep(0.5)  # wake-ups of the commands above still on their way
                woke.clear()
                # Once subscribed, a single command is enough.
                store.submit_command(self.command("wake-once", 100))
                assert woke.wait(5), "a single command woke no subscriber within 5 s"
            finally:
                unsubscribe()

    def test_capability_addressed_wakeups_wake_the_holder_alone(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_commands_for()")
            assert isinstance(store, CommandChannel)
            for task_id, holder in (("a-task", "node-a"), ("b-task", "node-b")):
                store.create(self.snapshot(task_id, status=TaskStatus.RUNNING, lease_owner=holder))
            woken = {"node-a": 0, "node-b": 0}
            lock = threading.Condition()

            def waker(node: str) -> Callable[[], None]:
                def wake() -> None:
                    with lock:
                        woken[node] += 1
                        lock.notify_all()

                return wake

            def wait_for(a: int, b: int) -> None:
                with lock:
                    lock.wait_for(lambda: woken["node-a"] >= a and woken["node-b"] >= b, 10)
                    assert woken["node-a"] >= a and woken["node-b"] >= b, woken

            stops = [store.subscribe_commands_for(n, waker(n)) for n in woken]
            try:
                if None in stops:
                    raise SkipTest(f"{type(store).__name__} cannot wake a subscriber here")
                # Both listening: a command of no task's (anyone's) wakes both.
                for i in range(40):
                    store.submit_command(self.command(f"anyone-{i}", i, task_id=f"gone-{i}"))
                    with lock:
                        if lock.wait_for(lambda: min(woken.values()) > 0, 0.25):
                            break
                wait_for(1, 1)
                time.sleep(0.5)  # wake-ups of the commands above still on their way
                with lock:
                    woken.update({"node-a": 0, "node-b": 0})
                # B's task's command wakes B; then anyone's wakes both. (Waking A for B's
                # too is allowed; a store that addresses its wake-ups is tested apart.)
                store.submit_command(self.command("for-b", 50, task_id="b-task"))
                store.submit_command(self.command("for-anyone", 51, task_id="gone"))
                wait_for(1, 2)
            finally:
                for stop in stops:
                    if stop is not None:
                        stop()

    def test_capability_transition_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_transitions()")
            assert isinstance(store, CommandChannel)
            woke = threading.Event()
            unsubscribe = store.subscribe_transitions(woke.set)
            if unsubscribe is None:
                raise SkipTest(f"{type(store).__name__} wakes no follower")
            try:
                # The subscription may take a moment to start: keep appending a while.
                for i in range(40):
                    store.create(self.snapshot(f"woken-{i}"))
                    store.append(self.transition(f"woken-{i}", 1, TaskStatus.QUEUED))
                    if woke.wait(0.25):
                        break
                assert woke.is_set(), "no wake-up within 10 s of appending transitions"
                time.sleep(0.5)  # wake-ups of the appends above still on their way
                woke.clear()
                # Once subscribed, a single append is enough.
                store.append(
                    self.transition(
                        "woken-0", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED
                    )
                )
                assert woke.wait(5), "no wake-up within 5 s of one append"
            finally:
                unsubscribe()

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

    def test_capability_late_reports_are_kept_beside_the_task_and_pruned_with_it(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "late reports")
            assert isinstance(store, Maintenance)
            failure = Failure(kind=FailureKind.EXCEPTION, message="ValueError: no")
            for task_id in ("done", "broke"):
                store.create(self.snapshot(task_id, status=TaskStatus.LOST, created_at=at(0)))
            assert store.late_reports() == [] and store.count_late_reports() == 0
            done = LateReport(
                task_id="done",
                reported_by="node-a",
                reported_at=at(10),
                status=TaskStatus.SUCCEEDED,
                stored_status=TaskStatus.LOST,
                ended_at=at(9),
                outcome={"rows": 3, "name": "é ✓"},
            )
            broke = LateReport(
                task_id="broke",
                reported_by="node-a",
                reported_at=at(20),
                status=TaskStatus.FAILED,
                stored_status=TaskStatus.LOST,
                ended_at=at(19),
                failure=failure,
            )
            store.record_late_report(done)
            store.record_late_report(broke)
            assert store.late_reports() == [broke, done]  # newest first
            assert store.late_reports(task_ids=["done", "ghost"]) == [done]
            assert store.late_reports(task_ids=[]) == []
            assert store.late_reports(limit=1) == [broke]
            assert store.count_late_reports() == 2
            again = replace(done, reported_at=at(30), outcome=[1, 2])
            store.record_late_report(again)  # one per task: replaced
            assert store.late_reports(task_ids=["done"]) == [again]
            kept = store.get("done")
            assert kept is not None and kept.status is TaskStatus.LOST  # never a change
            assert store.prune(keep_terminal=0) == 2
            assert store.late_reports() == [] and store.count_late_reports() == 0

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

    def test_capability_holds_are_kept_replaced_released_and_pruned(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "holds")
            assert isinstance(store, CommandChannel)
            for task_id in ("h1", "h2", "h3"):
                store.create(self.snapshot(task_id))
            store.hold_task("h1", since=at(5), by="node-a")
            store.hold_task("h2", since=at(3), by="node-a")
            store.hold_task("h1", since=at(7), by="node-b")  # a later hold replaces it
            assert store.holds() == {"h2": at(3), "h1": at(7)}
            assert list(store.holds(limit=1)) == ["h2"]  # the oldest first
            assert store.holds(task_ids=["h1", "h3"]) == {"h1": at(7)}
            assert store.holds(task_ids=[]) == {}
            store.release_hold("h2")
            store.release_hold("h3")  # never held: nothing to do
            assert store.holds() == {"h1": at(7)}
            done = self.snapshot("h1", status=TaskStatus.CANCELLED, ended_at=at(8))
            store.save(done, expect_version=1)
            assert store.prune(keep_terminal=0) == 1
            assert store.holds() == {}

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

    def test_capability_command_log_lists_finished_commands_by_finish(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "a command log")
            assert isinstance(store, CommandChannel)
            for name in ("c1", "c2", "c3"):
                store.submit_command(self.command(name, 0))
            store.complete_command("c2", now=at(20), outcome="paused")
            store.complete_command("c1", now=at(30), outcome="already-terminal")
            done = store.finished_commands(after=at(0))
            assert [c.command_id for c in done] == ["c2", "c1"]  # c3 is still open
            assert done[0].finished_at == at(20) and done[0].outcome == "paused"
            assert [c.command_id for c in store.finished_commands(after=at(20))] == ["c1"]
            assert [c.command_id for c in store.finished_commands(after=at(0), limit=1)] == ["c2"]

    def test_capability_pending_commands_lists_a_tasks_open_commands_in_arrival_order(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "pending commands")
            assert isinstance(store, CommandChannel)
            assert store.pending_commands("t1") == []
            for cid, created, task in (("c2", 2, "t1"), ("x", 0, "t2"), ("c1", 1, "t1")):
                store.submit_command(self.command(cid, created, task))
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.claim_commands(now=at(10), lease_seconds=30, limit=1)  # c2: leased
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.complete_command("c2", now=at(11), outcome="pausing")
            pending = store.pending_commands("t1")
            assert [c.command_id for c in pending] == ["c1"]
            assert pending[0].action is CommandAction.STOP and pending[0].issued_by == "tester"

    def test_capability_storage_clock_tells_aware_forward_time(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsStorageClock, "a storage clock")
            assert isinstance(store, SupportsStorageClock)
            first, second = store.storage_now(), store.storage_now()
            assert first.tzinfo is UTC and second >= first

    def test_capability_holder_claim_hands_a_node_only_what_it_may_act_on(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "claim_commands_for()")
            assert isinstance(store, CommandChannel)
            S = TaskStatus
            tasks = [
                ("mine", S.RUNNING, "node-a"),
                ("theirs", S.RUNNING, "node-b"),
                ("ended", S.SUCCEEDED, "node-b"),  # finished: anyone completes it
                ("unleased", S.QUEUED, None),
            ]
            for task_id, status, holder in tasks:
                store.create(self.snapshot(task_id, status=status, lease_owner=holder))
            order = ["mine", "theirs", "ended", "unleased", "gone", "mine"]
            for i, task_id in enumerate(order):  # "gone": no such task
                store.submit_command(self.command(f"c{i}-{task_id}", i, task_id=task_id))
            claimed = store.claim_commands_for("node-a", now=at(10), lease_seconds=60)
            assert [c.command_id for c in claimed] == [
                "c0-mine",
                "c2-ended",
                "c3-unleased",
                "c4-gone",
                "c5-mine",
            ]
            assert store.claim_commands_for("node-a", now=at(11), lease_seconds=60) == []
            theirs = store.claim_commands_for("node-b", now=at(12), lease_seconds=60)
            assert [c.command_id for c in theirs] == ["c1-theirs"]
