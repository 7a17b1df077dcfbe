"""``StoreContract``: the executable specification of ``TaskStore``.

Subclass it, implement ``make_store()`` to return a fresh, isolated store, and let pytest
collect the ``test_*`` methods (or call ``StoreContract.verify()`` without pytest)::

    class TestMyStore(StoreContract):
        def make_store(self) -> TaskStore:
            return MyStore(...)

It imports no pytest and uses plain asserts, because it is a specification for store
authors, not this repository's internal test. It proves single-connection semantics only:
cross-process atomicity must be proven separately against the real backend.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest import SkipTest

from ..errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ..model import (
    Command,
    CommandAction,
    Failure,
    FailureKind,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ..stores.capabilities import (
    SupportsAtomic,
    SupportsCommandWakeups,
    SupportsCreateMany,
    SupportsMarkLost,
    SupportsWriteTransitions,
    rules_of,
)
from ..stores.protocol import TaskStore

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _raises(exc: type[BaseException], fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except exc as caught:
        return caught
    raise AssertionError(f"expected {exc.__name__}")


class StoreContract:
    """Every rule of the store guide as a test. Subclasses provide ``make_store()``."""

    def make_store(self) -> TaskStore:
        """Return a new, empty, isolated store."""
        raise NotImplementedError("subclasses of StoreContract implement make_store()")

    # -- helpers --------------------------------------------------------------------------------

    @contextmanager
    def _store(self) -> Iterator[TaskStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @staticmethod
    def snapshot(task_id: str = "t1", **changes: Any) -> TaskSnapshot:
        base = TaskSnapshot(
            task_id=task_id,
            name="job",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=T0,
        )
        return replace(base, **changes)

    @staticmethod
    def transition(task_id: str, version: int, to: TaskStatus, **changes: Any) -> Transition:
        base = Transition(
            task_id=task_id,
            version=version,
            from_status=None,
            to_status=to,
            at=_at(version),
        )
        return replace(base, **changes)

    @staticmethod
    def command(command_id: str, created: float, task_id: str = "t1") -> Command:
        return Command(
            command_id=command_id,
            task_id=task_id,
            action=CommandAction.STOP,
            created_at=_at(created),
            issued_by="tester",
        )

    # -- structure and round trip ------------------------------------------------------------------

    def test_is_a_task_store(self) -> None:
        with self._store() as store:
            assert isinstance(store, TaskStore)

    def test_every_field_round_trips(self) -> None:
        shanghai = timezone(timedelta(hours=8))
        full = TaskSnapshot(
            task_id="full-1",
            name="reports.daily",
            status=TaskStatus.RUNNING,
            status_version=7,
            attempt=2,
            tags=frozenset({"io", "报表", 'quo"te'}),
            bucket=0,
            bucket_key="tenant-42",
            pipeline_run_id="pipe-9",
            owner="node-a:123",
            created_at=datetime(2026, 3, 1, 20, 0, 0, 123456, tzinfo=shanghai),
            started_at=_at(1.5),
            ended_at=_at(99.000001),
            last_heartbeat_at=_at(2.25),
            progress=Progress(current=3.5, total=10.0, message="第 3 步"),
            failure=Failure(
                kind=FailureKind.TIMEOUT,
                message="timed out",
                exception_type="builtins.TimeoutError",
                carrier_may_run=True,
            ),
            outcome={"rows": [1, 2.5, None, True], "note": "ok ✓", "nested": {"a": []}},
            lease_owner="node-a:123",
            lease_until=_at(30),
        )
        with self._store() as store:
            store.create(full)
            got = store.get("full-1")
            assert got == full, f"round trip lost data:\n{got}\n!=\n{full}"
            assert got.created_at.tzinfo == UTC and got.created_at == full.created_at
            assert got.tags == full.tags and isinstance(got.tags, frozenset)

    def test_minimal_snapshot_round_trips(self) -> None:
        with self._store() as store:
            minimal = self.snapshot("min")
            store.create(minimal)
            assert store.get("min") == minimal

    def test_scalar_outcomes_round_trip(self) -> None:
        with self._store() as store:
            for i, outcome in enumerate([0, "", "text", 1.25, False, [], {}]):
                snap = self.snapshot(f"o{i}", status=TaskStatus.SUCCEEDED, outcome=outcome)
                store.create(snap)
                got = store.get(f"o{i}")
                assert got is not None and got.outcome == outcome
                assert type(got.outcome) is type(outcome)

    def test_text_round_trips_exactly(self) -> None:
        """Any UTF-8 text, in every text field and inside JSON, comes back as it went in;
        NUL too when the store declares ``value_rules.nul_in_text``."""
        texts = [
            "naïve café",
            "日本語 ✓ 🚀",
            'quote " backslash \\ and the literal text \\u0000',
            "tab\tnew\nline",
        ]
        with self._store() as store:
            if rules_of(store).nul_in_text:
                texts.append("nul\x00inside")
            for i, text in enumerate(texts):
                task_id = f"text-{i}"
                snap = self.snapshot(
                    task_id,
                    name=text,
                    tags=frozenset({text}),
                    bucket_key=text,
                    owner=text,
                    progress=Progress(current=1, message=text),
                    failure=Failure(kind=FailureKind.EXCEPTION, message=text),
                    outcome={text: [text]},
                    created_at=_at(i),
                )
                store.create(snap)
                assert store.get(task_id) == snap, f"text {text!r} did not round-trip"
                trail = self.transition(task_id, 1, TaskStatus.QUEUED, reason=text, actor=text)
                store.append(trail)
                assert store.history(task_id) == [trail]
                assert self._ids(store.query(TaskQuery(tag=text))) == [task_id]
                assert self._ids(store.query(TaskQuery(name=text))) == [task_id]

    def test_get_of_a_missing_task_returns_none(self) -> None:
        with self._store() as store:
            assert store.get("nope") is None

    def test_create_refuses_an_existing_id(self) -> None:
        with self._store() as store:
            original = self.snapshot("t1", status=TaskStatus.RUNNING, status_version=3)
            store.create(original)
            _raises(StoreError, lambda: store.create(self.snapshot("t1")))
            assert store.get("t1") == original

    # -- optimistic concurrency ------------------------------------------------------------------

    def test_save_accepts_the_expected_version(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            running = self.snapshot(status=TaskStatus.RUNNING, status_version=2, started_at=_at(1))
            store.save(running, expect_version=1)
            assert store.get("t1") == running

    def test_save_rejects_a_stale_version_and_leaves_the_row(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            current = self.snapshot(status=TaskStatus.STARTING, status_version=2)
            store.save(current, expect_version=1)
            stale = self.snapshot(status=TaskStatus.CANCELLED, status_version=2)
            _raises(ConcurrencyConflict, lambda: store.save(stale, expect_version=1))
            assert store.get("t1") == current

    def test_save_accepts_a_version_jump(self) -> None:
        # Write-through catch-up lands several transitions at once: 1 -> 4 is legal.
        with self._store() as store:
            store.create(self.snapshot())
            jumped = self.snapshot(status=TaskStatus.SUCCEEDED, status_version=4, outcome=1)
            store.save(jumped, expect_version=1)
            assert store.get("t1") == jumped

    def test_save_of_a_missing_task_conflicts(self) -> None:
        with self._store() as store:
            _raises(ConcurrencyConflict, lambda: store.save(self.snapshot(), expect_version=1))
            assert store.get("t1") is None

    def test_save_does_not_clobber_the_lease(self) -> None:
        # The memory store once replaced the whole row and reset the lease to None;
        # reconcile() then judged a healthy task LOST.
        with self._store() as store:
            store.create(self.snapshot())
            store.touch("t1", lease_owner="node-a", lease_until=_at(30))
            stale_view = self.snapshot(status=TaskStatus.STARTING, status_version=2)
            assert stale_view.lease_owner is None
            store.save(stale_view, expect_version=1)
            got = store.get("t1")
            assert got is not None
            assert got.status == TaskStatus.STARTING
            assert got.lease_owner == "node-a" and got.lease_until == _at(30)

    def test_save_writes_the_heartbeat_it_is_given(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            saved = self.snapshot(
                status_version=2, last_heartbeat_at=_at(5), progress=Progress(current=1)
            )
            store.save(saved, expect_version=1)
            assert store.get("t1") == saved

    # -- queries ---------------------------------------------------------------------------------

    def _populate(self, store: TaskStore) -> None:
        rows = [
            self.snapshot(
                "a", name="etl.load", tags=frozenset({"io"}), bucket=0, created_at=_at(1)
            ),
            self.snapshot(
                "b",
                name="etl.transform",
                status=TaskStatus.RUNNING,
                tags=frozenset({"ios", "cpu"}),
                bucket=1,
                pipeline_run_id="p1",
                created_at=_at(2),
            ),
            self.snapshot(
                "c",
                name="report",
                status=TaskStatus.SUCCEEDED,
                tags=frozenset({"io", "cpu"}),
                bucket=2,
                pipeline_run_id="p1",
                created_at=_at(3),
            ),
            self.snapshot("d", name="etl", status=TaskStatus.FAILED, created_at=_at(4)),
            self.snapshot(
                "e", name="etl.load", status=TaskStatus.RUNNING, bucket=1, created_at=_at(5)
            ),
        ]
        for row in rows:
            store.create(row)

    @staticmethod
    def _ids(snapshots: list[TaskSnapshot]) -> list[str]:
        return [s.task_id for s in snapshots]

    def test_query_of_an_empty_store_is_empty(self) -> None:
        with self._store() as store:
            assert store.query() == []
            assert store.query(TaskQuery(statuses=frozenset({TaskStatus.QUEUED}))) == []
            assert store.counts() == {} or set(store.counts().values()) == {0}

    def test_query_without_filters_returns_all_in_created_order(self) -> None:
        with self._store() as store:
            self._populate(store)
            assert self._ids(store.query()) == ["a", "b", "c", "d", "e"]
            assert self._ids(store.query(None)) == ["a", "b", "c", "d", "e"]

    def test_query_filters_each_alone(self) -> None:
        with self._store() as store:
            self._populate(store)
            running = frozenset({TaskStatus.RUNNING})
            cases: list[tuple[TaskQuery, list[str]]] = [
                (TaskQuery(statuses=running), ["b", "e"]),
                (TaskQuery(statuses=frozenset({TaskStatus.FAILED, TaskStatus.QUEUED})), ["a", "d"]),
                (TaskQuery(statuses=frozenset()), []),
                (TaskQuery(name="etl.load"), ["a", "e"]),
                (TaskQuery(name="etl"), ["d"]),
                (TaskQuery(name_prefix="etl."), ["a", "b", "e"]),
                (TaskQuery(name_prefix="etl"), ["a", "b", "d", "e"]),
                (TaskQuery(name_prefix="ETL"), []),
                (TaskQuery(tag="cpu"), ["b", "c"]),
                (TaskQuery(buckets=frozenset({1})), ["b", "e"]),
                (TaskQuery(buckets=frozenset({0, 2})), ["a", "c"]),
                (TaskQuery(buckets=frozenset()), []),
                (TaskQuery(pipeline_run_id="p1"), ["b", "c"]),
                (TaskQuery(pipeline_run_id="p2"), []),
            ]
            for query, expected in cases:
                assert self._ids(store.query(query)) == expected, (query, expected)

    def test_query_filters_combine_with_and(self) -> None:
        with self._store() as store:
            self._populate(store)
            cases: list[tuple[TaskQuery, list[str]]] = [
                (TaskQuery(name="etl.load", statuses=frozenset({TaskStatus.RUNNING})), ["e"]),
                (TaskQuery(tag="cpu", buckets=frozenset({2})), ["c"]),
                (TaskQuery(pipeline_run_id="p1", statuses=frozenset({TaskStatus.RUNNING})), ["b"]),
                (TaskQuery(name_prefix="etl", buckets=frozenset({1}), tag="io"), []),
                (TaskQuery(name_prefix="etl", buckets=frozenset({0, 1}), limit=2), ["a", "b"]),
            ]
            for query, expected in cases:
                assert self._ids(store.query(query)) == expected, (query, expected)

    def test_query_orders_and_limits(self) -> None:
        with self._store() as store:
            self._populate(store)
            assert self._ids(store.query(TaskQuery(newest_first=True))) == ["e", "d", "c", "b", "a"]
            assert self._ids(store.query(TaskQuery(limit=2))) == ["a", "b"]
            assert self._ids(store.query(TaskQuery(limit=2, newest_first=True))) == ["e", "d"]
            assert store.query(TaskQuery(limit=0)) == []

    def test_query_ties_keep_insertion_order(self) -> None:
        with self._store() as store:
            for task_id in ["z", "m", "a"]:
                store.create(self.snapshot(task_id, created_at=T0))
            assert self._ids(store.query()) == ["z", "m", "a"]
            assert self._ids(store.query(TaskQuery(newest_first=True))) == ["a", "m", "z"]

    def test_query_orders_by_instant_not_by_zone(self) -> None:
        with self._store() as store:
            tokyo = timezone(timedelta(hours=9))
            # 20:00 in Tokyo is 11:00 UTC: earlier than 12:00 UTC despite the larger hour.
            store.create(self.snapshot("late", created_at=T0))
            store.create(
                self.snapshot("early", created_at=datetime(2026, 3, 1, 20, 0, tzinfo=tokyo))
            )
            assert self._ids(store.query()) == ["early", "late"]

    def test_tag_match_is_exact(self) -> None:
        with self._store() as store:
            store.create(self.snapshot("io", tags=frozenset({"io"})))
            store.create(self.snapshot("ios", tags=frozenset({"ios"})))
            store.create(self.snapshot("bio", tags=frozenset({"bio", "x"})))
            store.create(self.snapshot("quoted", tags=frozenset({'"io"'})))
            # An element whose JSON text holds another tag's JSON text, quotes and all.
            store.create(self.snapshot("tricky", tags=frozenset({'x","io', "a\\"})))
            assert self._ids(store.query(TaskQuery(tag="io"))) == ["io"]
            assert self._ids(store.query(TaskQuery(tag="i"))) == []
            assert self._ids(store.query(TaskQuery(tag='"io"'))) == ["quoted"]
            assert self._ids(store.query(TaskQuery(tag="%"))) == []
            assert self._ids(store.query(TaskQuery(tag='x","io'))) == ["tricky"]
            assert self._ids(store.query(TaskQuery(tag="a\\"))) == ["tricky"]

    def test_counts_by_status(self) -> None:
        with self._store() as store:
            self._populate(store)
            counts = {s: n for s, n in store.counts().items() if n}
            assert counts == {
                TaskStatus.QUEUED: 1,
                TaskStatus.RUNNING: 2,
                TaskStatus.SUCCEEDED: 1,
                TaskStatus.FAILED: 1,
            }
            assert all(isinstance(s, TaskStatus) for s in counts)

    # -- audit trail -----------------------------------------------------------------------------

    def test_append_is_idempotent(self) -> None:
        with self._store() as store:
            first = self.transition("t1", 1, TaskStatus.QUEUED, reason="submitted")
            store.append(first)
            store.append(first)
            store.append(replace(first, reason="replayed"))
            assert store.history("t1") == [first]

    def test_history_is_version_ascending_with_since_version(self) -> None:
        with self._store() as store:
            q = self.transition("t1", 1, TaskStatus.QUEUED, actor="node-a")
            s = self.transition("t1", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED)
            r = self.transition("t1", 3, TaskStatus.RUNNING, from_status=TaskStatus.STARTING)
            done = self.transition(
                "t1", 5, TaskStatus.SUCCEEDED, from_status=TaskStatus.RUNNING, reason="ok"
            )
            for t in (done, s, q, r):
                store.append(t)
            store.append(self.transition("other", 1, TaskStatus.QUEUED))
            assert store.history("t1") == [q, s, r, done]
            assert store.history("t1", since_version=2) == [r, done]
            assert store.history("t1", since_version=5) == []
            assert store.history("unknown") == []

    # -- side channel ----------------------------------------------------------------------------

    def test_touch_does_not_change_the_version(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            store.touch("t1", progress=Progress(current=5, total=10), heartbeat_at=_at(7))
            got = store.get("t1")
            assert got is not None
            assert got.status_version == 1
            assert got.progress == Progress(current=5, total=10)
            assert got.last_heartbeat_at == _at(7)
            store.save(self.snapshot(status_version=2, progress=got.progress), expect_version=1)

    def test_touch_of_a_missing_task_is_silent(self) -> None:
        with self._store() as store:
            store.touch("ghost", progress=Progress(current=1), heartbeat_at=_at(1))
            store.touch("ghost", lease_owner="x", lease_until=_at(1))
            assert store.get("ghost") is None

    def test_touch_parameters_are_independent(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            store.touch("t1", heartbeat_at=_at(1))
            store.touch("t1", progress=Progress(current=2, message="two"))
            store.touch("t1", lease_owner="node-a")
            store.touch("t1", lease_until=_at(30))
            store.touch("t1")
            got = store.get("t1")
            assert got is not None
            assert got.last_heartbeat_at == _at(1)
            assert got.progress == Progress(current=2, message="two")
            assert got.lease_owner == "node-a" and got.lease_until == _at(30)
            store.touch("t1", heartbeat_at=_at(2))
            again = store.get("t1")
            assert again is not None and again.progress == got.progress
            assert again.lease_until == _at(30) and again.last_heartbeat_at == _at(2)

    # -- commands --------------------------------------------------------------------------------

    def test_claim_leases_commands_in_created_order_with_limit(self) -> None:
        with self._store() as store:
            for cid, created in (("c3", 3), ("c1", 1), ("c2", 2)):
                store.submit_command(self.command(cid, created))
            first = store.claim_commands(now=_at(10), lease_seconds=30, limit=2)
            assert [c.command_id for c in first] == ["c1", "c2"]
            assert all(c.lease_until == _at(40) for c in first)
            assert first[0].issued_by == "tester" and first[0].action == CommandAction.STOP
            rest = store.claim_commands(now=_at(11), lease_seconds=30)
            assert [c.command_id for c in rest] == ["c3"]

    def test_a_leased_command_is_not_claimed_again_until_expiry(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            assert len(store.claim_commands(now=_at(10), lease_seconds=30)) == 1
            assert store.claim_commands(now=_at(20), lease_seconds=30) == []
            assert store.claim_commands(now=_at(39.999), lease_seconds=30) == []
            again = store.claim_commands(now=_at(40), lease_seconds=30)
            assert [c.command_id for c in again] == ["c1"]
            assert again[0].lease_until == _at(70)

    def test_a_completed_command_is_never_claimed_again(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=_at(10), lease_seconds=30)
            store.complete_command("c1", now=_at(11), outcome="stopped")
            assert store.claim_commands(now=_at(1000), lease_seconds=30) == []
            store.complete_command("unknown", now=_at(12), outcome="x")

    def test_release_returns_a_command_without_completing_it(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=_at(10), lease_seconds=30)
            store.release_command("c1", now=_at(11))
            again = store.claim_commands(now=_at(11), lease_seconds=30)
            assert [c.command_id for c in again] == ["c1"]
            assert again[0].finished_at is None and again[0].outcome is None
            store.release_command("unknown", now=_at(12))

    def test_release_does_not_reopen_a_completed_command(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=_at(10), lease_seconds=30)
            store.complete_command("c1", now=_at(11), outcome="stopped")
            store.release_command("c1", now=_at(12))
            assert store.claim_commands(now=_at(13), lease_seconds=30) == []

    # -- operations ------------------------------------------------------------------------------

    def test_prune_drops_only_the_oldest_terminal_tasks_and_their_history(self) -> None:
        with self._store() as store:
            statuses = [
                TaskStatus.SUCCEEDED,
                TaskStatus.RUNNING,
                TaskStatus.FAILED,
                TaskStatus.QUEUED,
                TaskStatus.LOST,
                TaskStatus.CANCELLED,
                TaskStatus.PAUSED,
                TaskStatus.STOPPED,
            ]
            for i, status in enumerate(statuses):
                store.create(self.snapshot(f"t{i}", status=status, created_at=_at(i)))
                store.append(self.transition(f"t{i}", 1, status))
            assert store.prune(keep_terminal=2) == 3
            left = self._ids(store.query())
            assert left == ["t1", "t3", "t5", "t6", "t7"]
            assert store.history("t0") == [] and store.history("t2") == []
            assert store.history("t4") == []
            assert len(store.history("t1")) == 1 and len(store.history("t5")) == 1
            assert store.prune(keep_terminal=2) == 0
            assert store.prune(keep_terminal=0) == 2
            assert self._ids(store.query()) == ["t1", "t3", "t6"]

    def test_close_is_idempotent_and_later_calls_raise_store_error(self) -> None:
        store = self.make_store()
        store.create(self.snapshot())
        store.close()
        store.close()
        calls: list[Callable[[], object]] = [
            lambda: store.get("t1"),
            lambda: store.query(),
            lambda: store.create(self.snapshot("t2")),
            lambda: store.save(self.snapshot(status_version=2), expect_version=1),
            lambda: store.counts(),
            lambda: store.history("t1"),
            lambda: store.claim_commands(now=T0, lease_seconds=1),
        ]
        for call in calls:
            _raises(StoreError, call)

    # -- optional capabilities: each runs only where the store declares it -----------------

    @staticmethod
    def _declares(store: TaskStore, capability: type, name: str) -> None:
        if not isinstance(store, capability):
            raise SkipTest(f"{type(store).__name__} does not declare {name} (optional)")

    def test_capability_atomic_commits_together_or_not_at_all(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsAtomic, "atomic()")
            assert isinstance(store, SupportsAtomic)
            with store.atomic():
                store.create(self.snapshot("a1"))
                store.append(self.transition("a1", 1, TaskStatus.QUEUED))
            assert store.get("a1") is not None and len(store.history("a1")) == 1

            class Undo(Exception):
                pass

            try:
                with store.atomic():
                    store.create(self.snapshot("a2"))
                    store.append(self.transition("a2", 1, TaskStatus.QUEUED))
                    raise Undo
            except Undo:
                pass
            assert store.get("a2") is None and store.history("a2") == []

    def test_capability_create_many_is_all_or_nothing(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsCreateMany, "create_many()")
            assert isinstance(store, SupportsCreateMany)

            def item(task_id: str) -> tuple[TaskSnapshot, Transition]:
                return self.snapshot(task_id), self.transition(task_id, 1, TaskStatus.QUEUED)

            store.create_many([item("m1"), item("m2"), item("m3")])
            assert self._ids(store.query()) == ["m1", "m2", "m3"]
            assert all(len(store.history(t)) == 1 for t in ("m1", "m2", "m3"))
            _raises(TaskAlreadyExists, lambda: store.create_many([item("n1"), item("m2")]))
            assert store.get("n1") is None and store.history("n1") == []

    def test_capability_write_transitions_is_a_compare_and_set_with_its_trail(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsWriteTransitions, "write_transitions()")
            assert isinstance(store, SupportsWriteTransitions)
            store.create(self.snapshot(tags=frozenset({"io"}), bucket=3, bucket_key="k"))
            store.touch("t1", lease_owner="node-a", lease_until=_at(30))
            running = self.snapshot(
                status=TaskStatus.RUNNING,
                status_version=3,
                attempt=1,
                started_at=_at(1),
                tags=frozenset({"io"}),
                bucket=3,
                bucket_key="k",
            )
            trail = [
                self.transition("t1", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED),
                self.transition("t1", 3, TaskStatus.RUNNING, from_status=TaskStatus.STARTING),
            ]
            store.write_transitions(running, expect_version=1, transitions=trail)
            got = store.get("t1")
            assert got is not None
            assert replace(got, lease_owner=None, lease_until=None) == running
            assert got.lease_owner == "node-a" and got.lease_until == _at(30)  # never the lease
            assert store.history("t1") == trail
            late = self.transition("t1", 4, TaskStatus.FAILED, from_status=TaskStatus.RUNNING)
            stale = self.snapshot(status=TaskStatus.FAILED, status_version=4)
            _raises(
                ConcurrencyConflict,
                lambda: store.write_transitions(stale, expect_version=1, transitions=[late]),
            )
            assert store.get("t1") == got and store.history("t1") == trail  # nothing written

    def test_capability_mark_lost_marks_only_tasks_that_did_not_move(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsMarkLost, "mark_lost()")
            assert isinstance(store, SupportsMarkLost)
            store.create(self.snapshot("still", status=TaskStatus.RUNNING, status_version=3))
            store.create(self.snapshot("moved", status=TaskStatus.RUNNING, status_version=5))
            failure = Failure(kind=FailureKind.LOST, message="lease expired", carrier_may_run=True)
            marks = []
            for task_id in ("still", "moved"):
                lost = self.snapshot(
                    task_id,
                    status=TaskStatus.LOST,
                    status_version=4,
                    ended_at=_at(9),
                    failure=failure,
                )
                marks.append(
                    (
                        lost,
                        self.transition(
                            task_id, 4, TaskStatus.LOST, from_status=TaskStatus.RUNNING
                        ),
                    )
                )
            assert store.mark_lost(marks) == {"still"}
            still = store.get("still")
            assert still is not None and still.status is TaskStatus.LOST
            assert still.status_version == 4 and still.failure == failure
            assert still.ended_at == _at(9)
            assert [t.version for t in store.history("still")] == [4]
            moved = store.get("moved")
            assert moved is not None and moved.status is TaskStatus.RUNNING
            assert moved.status_version == 5 and store.history("moved") == []

    def test_capability_command_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsCommandWakeups, "subscribe_commands()")
            assert isinstance(store, SupportsCommandWakeups)
            woke = threading.Event()
            unsubscribe = store.subscribe_commands(woke.set)
            try:
                # The subscription may take a moment to start: keep submitting a while.
                for i in range(40):
                    store.submit_command(self.command(f"wake-{i}", i))
                    if woke.wait(0.25):
                        break
                assert woke.is_set(), "no wake-up within 10 s of submitting commands"
            finally:
                unsubscribe()

    # -- running without pytest ------------------------------------------------------------------

    @classmethod
    def verify(cls) -> dict[str, str]:
        """Run every contract test on a fresh instance; return ``{test name: traceback}``
        for the failures (empty when the store passes). It never raises for a failure.
        A capability the store does not declare is not tested (and not a failure)."""
        failures: dict[str, str] = {}
        for name in sorted(dir(cls)):
            if name.startswith("test_"):
                try:
                    getattr(cls(), name)()
                except SkipTest:
                    continue
                except Exception:
                    failures[name] = traceback.format_exc()
        return failures
