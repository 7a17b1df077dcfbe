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

import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from fnmatch import fnmatchcase
from unittest import SkipTest

from ..errors import ConcurrencyConflict, StoreError
from ..model import (
    BRIEF_MESSAGE,
    CommandAction,
    Failure,
    FailureKind,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
)
from ..stores.protocol import TaskStore
from ..stores.roles import rules_of
from .capability_contract import CapabilityContract
from .contract_base import T0, at, raises

__all__ = ["StoreContract"]


NAMES = [
    "etl.load",
    "etl.extract",
    "etl",
    "etlx",
    "ETL.load",
    "a%b_c",
    "a.b.c",
    "br[ack]et",
    "back\\slash",
    "caret^x",
    "dash-y",
    "naïve.步骤",
    "line\nbreak",
]

GLOBS = [
    "etl.*",
    "etl",
    "etl*",
    "etl?load",
    "*.load",
    "ETL*",
    "a%b_c",
    "a_b%c",
    "a?b?c",
    "a.b.c",
    "br[[]ack]et",
    "br[ack]et",
    "br[!x]ck]et",
    "back\\*",
    "*^*",
    "caret[^]x",
    "dash[-]y",
    "[d-e]*",
    "[!a-e]*",
    "[z-a]*",
    "[!z-a]*",
    "[a-c-e]*",
    "*[.-.]*",
    "naïve.*",
    "*步骤",
    "line?break",
    "line*",
    "*",
    "[",
    "x[",
    "",
]


class StoreContract(CapabilityContract):
    """Every rule of the store contract (docs/stores.md) as a test. Subclasses provide
    ``make_store()``."""

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
            started_at=at(1.5),
            ended_at=at(99.000001),
            last_heartbeat_at=at(2.25),
            progress=Progress(current=3.5, total=10.0, message="第 3 步"),
            failure=Failure(
                kind=FailureKind.TIMEOUT,
                message="timed out",
                exception_type="builtins.TimeoutError",
                carrier_may_run=True,
            ),
            outcome={"rows": [1, 2.5, None, True], "note": "ok ✓", "nested": {"a": []}},
            lease_owner="node-a:123",
            lease_until=at(30),
            trace_context="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 k=v, o=w",
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
                    created_at=at(i),
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
            raises(StoreError, lambda: store.create(self.snapshot("t1")))
            assert store.get("t1") == original

    # -- optimistic concurrency ------------------------------------------------------------------

    def test_save_accepts_the_expected_version(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            running = self.snapshot(status=TaskStatus.RUNNING, status_version=2, started_at=at(1))
            store.save(running, expect_version=1)
            assert store.get("t1") == running

    def test_save_rejects_a_stale_version_and_leaves_the_row(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            current = self.snapshot(status=TaskStatus.STARTING, status_version=2)
            store.save(current, expect_version=1)
            stale = self.snapshot(status=TaskStatus.CANCELLED, status_version=2)
            raises(ConcurrencyConflict, lambda: store.save(stale, expect_version=1))
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
            raises(ConcurrencyConflict, lambda: store.save(self.snapshot(), expect_version=1))
            assert store.get("t1") is None

    def test_save_does_not_clobber_the_lease(self) -> None:
        # The memory store once replaced the whole row and reset the lease to None;
        # reconcile() then judged a healthy task LOST.
        with self._store() as store:
            store.create(self.snapshot())
            store.touch("t1", lease_owner="node-a", lease_until=at(30))
            stale_view = self.snapshot(status=TaskStatus.STARTING, status_version=2)
            assert stale_view.lease_owner is None
            store.save(stale_view, expect_version=1)
            got = store.get("t1")
            assert got is not None
            assert got.status == TaskStatus.STARTING
            assert got.lease_owner == "node-a" and got.lease_until == at(30)

    def test_save_writes_the_heartbeat_it_is_given(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            saved = self.snapshot(
                status_version=2, last_heartbeat_at=at(5), progress=Progress(current=1)
            )
            store.save(saved, expect_version=1)
            assert store.get("t1") == saved

    # -- queries ---------------------------------------------------------------------------------

    def _populate(self, store: TaskStore) -> None:
        rows = [
            self.snapshot("a", name="etl.load", tags=frozenset({"io"}), bucket=0, created_at=at(1)),
            self.snapshot(
                "b",
                name="etl.transform",
                status=TaskStatus.RUNNING,
                tags=frozenset({"ios", "cpu"}),
                bucket=1,
                pipeline_run_id="p1",
                owner="node-a",
                created_at=at(2),
            ),
            self.snapshot(
                "c",
                name="report",
                status=TaskStatus.SUCCEEDED,
                tags=frozenset({"io", "cpu"}),
                bucket=2,
                pipeline_run_id="p1",
                created_at=at(3),
            ),
            self.snapshot(
                "d", name="etl", status=TaskStatus.FAILED, owner="node-b", created_at=at(4)
            ),
            self.snapshot(
                "e",
                name="etl.load",
                status=TaskStatus.RUNNING,
                bucket=1,
                owner="node-a",
                created_at=at(5),
            ),
        ]
        for row in rows:
            store.create(row)

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
                (TaskQuery(pipeline_prefix="p"), ["b", "c"]),
                (TaskQuery(pipeline_prefix="p1x"), []),
                (TaskQuery(owner="node-a"), ["b", "e"]),
                (TaskQuery(owner="node"), []),  # exact, not a prefix
            ]
            for query, expected in cases:
                assert self._ids(store.query(query)) == expected, (query, expected)

    def test_query_filters_combine_with_and(self) -> None:
        with self._store() as store:
            self._populate(store)
            cases: list[tuple[TaskQuery, list[str]]] = [
                (TaskQuery(name="etl.load", statuses=frozenset({TaskStatus.RUNNING})), ["e"]),
                (TaskQuery(tag="cpu", buckets=frozenset({2})), ["c"]),
                (TaskQuery(owner="node-b", statuses=frozenset({TaskStatus.FAILED})), ["d"]),
                (TaskQuery(pipeline_run_id="p1", statuses=frozenset({TaskStatus.RUNNING})), ["b"]),
                (TaskQuery(name_prefix="etl", buckets=frozenset({1}), tag="io"), []),
                (TaskQuery(name_prefix="etl", buckets=frozenset({0, 1}), limit=2), ["a", "b"]),
            ]
            for query, expected in cases:
                assert self._ids(store.query(query)) == expected, (query, expected)

    def test_query_by_id_prefix(self) -> None:
        with self._store() as store:
            ids = ["a1b2c3d4", "a1b2c3ff", "a1b2c4", "a1b2c", "b1b2c3d4", "a1b2c3d4ex"]
            for n, task_id in enumerate(ids):
                store.create(self.snapshot(task_id, created_at=at(n)))
            cases: list[tuple[str, list[str]]] = [
                ("a1b2c3", ["a1b2c3d4", "a1b2c3ff", "a1b2c3d4ex"]),
                ("a1b2c3d4", ["a1b2c3d4", "a1b2c3d4ex"]),
                ("a1b2c3d4e", ["a1b2c3d4ex"]),
                ("a1b2c", ["a1b2c3d4", "a1b2c3ff", "a1b2c4", "a1b2c", "a1b2c3d4ex"]),
                ("A1B2C3", []),
                ("a1b2c5", []),
                ("b", ["b1b2c3d4"]),
                ("b\U0010ffff", []),  # the last code point: no next one bounds a range
            ]
            for prefix, expected in cases:
                assert self._ids(store.query(TaskQuery(id_prefix=prefix))) == expected, prefix
            assert self._ids(store.query(TaskQuery(id_prefix="a1b2c3", limit=2))) == ids[:2]

    def test_query_pages_back_by_creation_time(self) -> None:
        with self._store() as store:
            self._populate(store)  # a..e created at 1..5 s
            older = TaskQuery(created_until=at(3), newest_first=True)
            assert self._ids(store.query(older)) == ["c", "b", "a"]
            assert self._ids(store.query(TaskQuery(created_until=at(2.5)))) == ["a", "b"]
            assert store.query(TaskQuery(created_until=at(0))) == []
            for task_id in ["x", "y", "z"]:  # a tie: three tasks created at the same time
                store.create(self.snapshot(task_id, created_at=at(3)))
            tie = TaskQuery(created_until=at(3), newest_first=True, limit=3)
            assert self._ids(store.query(tie)) == ["z", "y", "x"]

    def test_query_orders_and_limits(self) -> None:
        with self._store() as store:
            self._populate(store)
            assert self._ids(store.query(TaskQuery(newest_first=True))) == ["e", "d", "c", "b", "a"]
            assert self._ids(store.query(TaskQuery(limit=2))) == ["a", "b"]
            assert self._ids(store.query(TaskQuery(limit=2, newest_first=True))) == ["e", "d"]
            assert store.query(TaskQuery(limit=0)) == []

    def test_query_ties_are_ordered_by_task_id(self) -> None:
        with self._store() as store:
            for task_id in ["z", "m", "a"]:
                store.create(self.snapshot(task_id, created_at=T0))
            assert self._ids(store.query()) == ["a", "m", "z"]
            assert self._ids(store.query(TaskQuery(newest_first=True))) == ["z", "m", "a"]

    def test_query_orders_by_instant_not_by_zone(self) -> None:
        with self._store() as store:
            tokyo = timezone(timedelta(hours=9))
            # 20:00 in Tokyo is 11:00 UTC: earlier than 12:00 UTC despite the larger hour.
            store.create(self.snapshot("late", created_at=T0))
            store.create(
                self.snapshot("early", created_at=datetime(2026, 3, 1, 20, 0, tzinfo=tokyo))
            )
            assert self._ids(store.query()) == ["early", "late"]

    def test_query_by_name_glob_is_fnmatchcase(self) -> None:
        with self._store() as store:
            for n, name in enumerate(NAMES):
                store.create(self.snapshot(f"g{n:02d}", name=name, created_at=at(n)))
            for glob in GLOBS:
                expected = [f"g{n:02d}" for n, name in enumerate(NAMES) if fnmatchcase(name, glob)]
                found = [s.task_id for s in store.query(TaskQuery(name_glob=glob))]
                assert found == expected, (glob, found, expected)
            limited = store.query(TaskQuery(name_glob="etl*", limit=2, newest_first=True))
            assert [s.task_id for s in limited] == ["g03", "g02"]

    def test_query_pages_by_key_through_ties(self) -> None:
        with self._store() as store:
            for n in range(5):
                store.create(self.snapshot(f"t{n}", created_at=at(n)))
            for task_id in ["u3", "u1", "u2", "u0"]:  # four created at one instant
                store.create(self.snapshot(task_id, created_at=at(2)))
            for newest_first in (True, False):
                whole = self._ids(store.query(TaskQuery(newest_first=newest_first)))
                pages: list[str] = []
                after = None
                for _ in range(len(whole) + 1):  # a store that pages at all ends by then
                    page = store.query(TaskQuery(newest_first=newest_first, limit=2, after=after))
                    if not page:
                        break
                    assert len(page) <= 2, f"a page of {len(page)}: it ignores TaskQuery.limit"
                    again = set(self._ids(page)) & set(pages)
                    assert not again, f"a page repeats {sorted(again)}: it ignores TaskQuery.after"
                    pages += self._ids(page)
                    after = (page[-1].created_at, page[-1].task_id)
                assert pages == whole, (newest_first, pages, whole)
            assert self._ids(store.query(TaskQuery(newest_first=True)))[:3] == ["t4", "t3", "u3"]
            older = TaskQuery(
                newest_first=True, after=(at(2), "u1"), statuses=frozenset({TaskStatus.QUEUED})
            )
            assert self._ids(store.query(older)) == ["u0", "t2", "t1", "t0"]

    def test_a_brief_query_lists_the_same_tasks_without_more_than_it_shows(self) -> None:
        message = "m" * (BRIEF_MESSAGE * 3)
        failure = Failure(kind=FailureKind.EXCEPTION, message="boom", traceback="Traceback ...")
        with self._store() as store:
            store.create(
                self.snapshot(
                    "heavy",
                    status=TaskStatus.SUCCEEDED,
                    outcome={"rows": ["x" * 1000] * 50},
                    progress=Progress(current=1, total=2, message=message),
                )
            )
            store.create(self.snapshot("failed", status=TaskStatus.FAILED, failure=failure))
            whole = {s.task_id: s for s in store.query()}
            brief = {s.task_id: s for s in store.query(TaskQuery(brief=True))}
            assert brief.keys() == whole.keys()
            heavy = brief["heavy"]
            assert heavy.outcome in (None, whole["heavy"].outcome)
            assert heavy.progress is not None and heavy.progress.message is not None
            assert (heavy.progress.current, heavy.progress.total) == (1, 2)
            assert heavy.progress.message in (message, message[:BRIEF_MESSAGE])
            cut = brief["failed"].failure
            assert cut is not None and (cut.kind, cut.message) == (failure.kind, "boom")
            assert cut.traceback in (None, failure.traceback)
            same = ("task_id", "name", "status", "status_version", "created_at", "tags")
            for task_id, s in brief.items():
                assert replace(s, outcome=None, progress=None, failure=None) == replace(
                    whole[task_id], outcome=None, progress=None, failure=None
                ), task_id
                assert all(getattr(s, f) == getattr(whole[task_id], f) for f in same)

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
            store.touch("t1", progress=Progress(current=5, total=10), heartbeat_at=at(7))
            got = store.get("t1")
            assert got is not None
            assert got.status_version == 1
            assert got.progress == Progress(current=5, total=10)
            assert got.last_heartbeat_at == at(7)
            store.save(self.snapshot(status_version=2, progress=got.progress), expect_version=1)

    def test_touch_of_a_missing_task_is_silent(self) -> None:
        with self._store() as store:
            store.touch("ghost", progress=Progress(current=1), heartbeat_at=at(1))
            store.touch("ghost", lease_owner="x", lease_until=at(1))
            assert store.get("ghost") is None

    def test_touch_never_lands_on_a_finished_task(self) -> None:
        with self._store() as store:
            for status in (TaskStatus.SUCCEEDED, TaskStatus.LOST):
                task_id = f"ended-{status.value}"
                store.create(self.snapshot(task_id, status=status))
                store.touch(task_id, heartbeat_at=at(3), lease_owner="node-a", lease_until=at(9))
                before = store.get(task_id)
                assert before is not None
                store.touch(
                    task_id,
                    progress=Progress(current=9),
                    heartbeat_at=at(50),
                    lease_owner="late",
                    lease_until=at(99),
                )
                assert store.get(task_id) == before, f"a touch landed on a {status.value} task"

    def test_touch_parameters_are_independent(self) -> None:
        with self._store() as store:
            store.create(self.snapshot())
            store.touch("t1", heartbeat_at=at(1))
            store.touch("t1", progress=Progress(current=2, message="two"))
            store.touch("t1", lease_owner="node-a")
            store.touch("t1", lease_until=at(30))
            store.touch("t1")
            got = store.get("t1")
            assert got is not None
            assert got.last_heartbeat_at == at(1)
            assert got.progress == Progress(current=2, message="two")
            assert got.lease_owner == "node-a" and got.lease_until == at(30)
            store.touch("t1", heartbeat_at=at(2))
            again = store.get("t1")
            assert again is not None and again.progress == got.progress
            assert again.lease_until == at(30) and again.last_heartbeat_at == at(2)

    # -- commands --------------------------------------------------------------------------------

    def test_claim_leases_commands_in_arrival_order_with_limit(self) -> None:
        with self._store() as store:
            # Stored in the order c3, c1, c2; their senders' clocks disagree with it.
            for cid, created, task in (("c3", 3, "t3"), ("c1", 1, "t1"), ("c2", 2, "t2")):
                store.submit_command(self.command(cid, created, task))
            first = store.claim_commands(now=at(10), lease_seconds=30, limit=2)
            assert [c.command_id for c in first] == ["c3", "c1"]
            assert all(c.lease_until == at(40) for c in first)
            assert first[0].issued_by == "tester" and first[0].action == CommandAction.STOP
            rest = store.claim_commands(now=at(11), lease_seconds=30)
            assert [c.command_id for c in rest] == ["c2"]

    def test_a_command_sent_from_a_slow_clock_stays_behind_the_earlier_one(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("stop", 100))
            store.submit_command(self.command("cancel", 40))  # its sender is 60 s behind
            got = store.claim_commands(now=at(101), lease_seconds=30)
            assert [c.command_id for c in got] == ["stop", "cancel"]

    def test_a_leased_command_holds_back_the_later_ones_of_its_task(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1, "t1"))
            assert [c.command_id for c in store.claim_commands(now=at(10), lease_seconds=30)] == [
                "c1"
            ]
            store.submit_command(self.command("c2", 2, "t1"))
            store.submit_command(self.command("other", 3, "t2"))
            # c1 is leased by another claimer: c2 must not overtake it, t2's may go.
            got = store.claim_commands(now=at(11), lease_seconds=30)
            assert [c.command_id for c in got] == ["other"]
            store.release_command("c1", now=at(12))
            got = store.claim_commands(now=at(12), lease_seconds=30)
            assert [c.command_id for c in got] == ["c1", "c2"]

    def test_a_limit_never_lets_a_later_command_of_a_task_pass(self) -> None:
        with self._store() as store:
            for cid, task in (("a1", "ta"), ("b1", "tb"), ("a2", "ta")):
                store.submit_command(self.command(cid, 1, task))
            got = store.claim_commands(now=at(10), lease_seconds=30, limit=1)
            assert [c.command_id for c in got] == ["a1"]
            store.complete_command("a1", now=at(10), outcome="stopping")
            got = store.claim_commands(now=at(10), lease_seconds=30)
            assert [c.command_id for c in got] == ["b1", "a2"]

    def test_a_leased_command_is_not_claimed_again_until_expiry(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            assert len(store.claim_commands(now=at(10), lease_seconds=30)) == 1
            assert store.claim_commands(now=at(20), lease_seconds=30) == []
            assert store.claim_commands(now=at(39.999), lease_seconds=30) == []
            again = store.claim_commands(now=at(40), lease_seconds=30)
            assert [c.command_id for c in again] == ["c1"]
            assert again[0].lease_until == at(70)

    def test_a_completed_command_is_never_claimed_again(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=at(10), lease_seconds=30)
            store.complete_command("c1", now=at(11), outcome="stopped")
            assert store.claim_commands(now=at(1000), lease_seconds=30) == []
            store.complete_command("unknown", now=at(12), outcome="x")

    def test_release_returns_a_command_without_completing_it(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=at(10), lease_seconds=30)
            store.release_command("c1", now=at(11))
            again = store.claim_commands(now=at(11), lease_seconds=30)
            assert [c.command_id for c in again] == ["c1"]
            assert again[0].finished_at is None and again[0].outcome is None
            store.release_command("unknown", now=at(12))

    def test_release_does_not_reopen_a_completed_command(self) -> None:
        with self._store() as store:
            store.submit_command(self.command("c1", 1))
            store.claim_commands(now=at(10), lease_seconds=30)
            store.complete_command("c1", now=at(11), outcome="stopped")
            store.release_command("c1", now=at(12))
            assert store.claim_commands(now=at(13), lease_seconds=30) == []

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
                store.create(self.snapshot(f"t{i}", status=status, created_at=at(i)))
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
            raises(StoreError, call)

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
