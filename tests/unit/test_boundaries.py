"""Truth at the boundaries: no value a task hands over, and no fault of one task, may cost
another task its truth. Each test names the failure story it prevents; each failed on the
main branch before the boundary checks existed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    Controller,
    FailureKind,
    InMemoryTaskStore,
    InvalidValue,
    Progress,
    SqliteTaskStore,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    TaskStore,
    Transition,
)
from chongming_task.model import trusted_transition
from chongming_task.run.life import Run
from chongming_task.testing import FaultyStore
from chongming_task.values import STRICT, ValueRules, check_json, storable_text
from tests.conftest import run_of, wait_until

S = TaskStatus
Make = Callable[..., Controller]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


# -- 1. progress is checked at checkpoint(), in the task's own thread --------------------------

BAD_PROGRESS: list[Any] = [
    float("nan"),
    float("inf"),
    Decimal("1.5"),
    True,
    "half",
    Progress(current=float("nan")),
    Progress(current=1, total=float("-inf")),
    Progress(current=Decimal(1)),  # type: ignore[arg-type]
    Progress(current=1, message=42),  # type: ignore[arg-type]
    Progress(current=1, message="report-\udcff.csv"),
]


@pytest.mark.parametrize("bad", BAD_PROGRESS, ids=repr)
def test_bad_progress_raises_in_the_task_and_stores_nothing(
    store: TaskStore, make_controller: Make, bad: Any
) -> None:
    c = make_controller(store)
    seen: list[BaseException] = []

    @c.task(name="reports")
    def reports(token: CancellationToken) -> str:
        token.checkpoint(Progress(current=1, total=4, message="ok"))
        try:
            token.checkpoint(bad)
        except ValueError as exc:  # InvalidValue is a ValueError
            seen.append(exc)
        return "done"

    run = c.submit(reports)
    assert run.result(5) == "done"
    assert len(seen) == 1 and isinstance(seen[0], InvalidValue)
    assert "progress" in str(seen[0])
    # Nothing of the bad value was kept: the last good progress, said complete by the
    # success, is what the store holds.
    wait_until(lambda: c.get(run.task_id).progress is not None, what="progress flushed")
    assert c.get(run.task_id).progress == Progress(current=4, total=4, message="ok")


def test_nul_in_a_progress_message_is_refused_where_the_store_cannot_hold_it() -> None:
    strict = FaultyStore(InMemoryTaskStore())
    strict.inner.value_rules = STRICT  # type: ignore[attr-defined]  # a Postgres-like store
    with Controller(strict, activity_interval=0.02) as c:
        seen: list[str] = []

        @c.task(name="nul")
        def nul(token: CancellationToken) -> None:
            try:
                token.checkpoint(Progress(current=1, message="a\x00b"))
            except InvalidValue as exc:
                seen.append(str(exc))

        c.submit(nul).wait(5)
        assert seen and "NUL" in seen[0]


def test_one_bad_progress_value_never_gets_healthy_tasks_marked_lost(tmp_path: Path) -> None:
    """The fault campaign's story: task B checkpointed NaN; every supervisor pass then
    raised before renewing any lease, so at 1.75 TTL another controller's reconcile
    marked B and the healthy A (which never checkpoints) lost, though both returned."""
    db = tmp_path / "t.db"
    node = Controller(SqliteTaskStore(db), lease_ttl=1.0, activity_interval=0.05)
    other = Controller(SqliteTaskStore(db), poll_commands=False)
    try:

        @node.task(name="quiet")
        def quiet(token: CancellationToken) -> str:
            time.sleep(2.5)  # healthy, never checkpoints: only its lease says it is alive
            return "a"

        @node.task(name="careless")
        def careless(token: CancellationToken) -> str:
            with contextlib.suppress(ValueError):
                token.checkpoint(Progress(current=float("nan")))
            time.sleep(2.5)
            return "b"

        a, b = node.submit(quiet), node.submit(careless)
        time.sleep(1.75)  # past the TTL of the leases written at submit
        report = other.reconcile()
        assert report.lost == ()
        assert a.result(5) == "a" and b.result(5) == "b"
        wait_until(lambda: node.get(b.task_id).status is S.SUCCEEDED, what="stored success")
        assert node.get(a.task_id).status is S.SUCCEEDED
    finally:
        other.close()
        other.store.close()
        node.close()
        node.store.close()


def test_one_tasks_store_error_never_costs_another_task_its_lease() -> None:
    """Every touch of task B fails in the store; task A's lease is still renewed (B was
    submitted first, so an aborted pass would have skipped A)."""
    store = FaultyStore(InMemoryTaskStore())
    release = threading.Event()
    with Controller(store, lease_ttl=0.6, activity_interval=0.02) as c:

        @c.task(name="wait")
        def wait(token: CancellationToken) -> None:
            token.checkpoint()
            release.wait(10)

        b = c.submit(wait)
        store.fail_when("touch", lambda task_id, **_: task_id == b.task_id)
        a = c.submit(wait)
        first = c.get(a.task_id).lease_until
        assert first is not None
        wait_until(
            lambda: (c.get(a.task_id).lease_until or first) > first + timedelta(seconds=0.3),
            what="task A's lease renewed while task B's touches fail",
        )
        assert store.failures.get("touch", 0) > 0
        release.set()
        assert a.wait(5).status is S.SUCCEEDED and b.wait(5).status is S.SUCCEEDED


def test_a_supervisor_pass_survives_any_step_failing(make_controller: Make) -> None:
    store = FaultyStore(InMemoryTaskStore())
    c = make_controller(store, lease_ttl=0.3)
    release = threading.Event()

    @c.task(name="wait")
    def wait(token: CancellationToken) -> None:
        while not release.is_set():
            token.checkpoint(Progress(current=1))
            token.sleep(0.01)

    run = c.submit(wait)
    wait_until(lambda: run.status is S.RUNNING)
    store.fail_next("touch", times=50)
    wait_until(lambda: store.failures.get("touch", 0) >= 50, what="touches failed")
    before = c.get(run.task_id).lease_until
    assert before is not None
    wait_until(
        lambda: (c.get(run.task_id).lease_until or before) > before,
        what="renewal resumed after the failures",
    )
    release.set()
    assert run.wait(5).status is S.SUCCEEDED


# -- 2 and 3. a result must be one the store can hold -----------------------------------------

UNSTORABLE_RESULTS: list[Any] = [
    "report-\udcff.csv",
    {"file\udcff": 1},
    ["ok", {"nested": ["\ud800"]}],
    10**5000,  # an int too long to print as JSON
    nested(100_000),
    float("inf"),
]


@pytest.mark.parametrize("result", UNSTORABLE_RESULTS, ids=lambda r: type(r).__name__)
def test_a_result_the_store_cannot_hold_fails_the_task_as_result_invalid(
    store: TaskStore, make_controller: Make, result: Any
) -> None:
    """docs/design.md, "Results", again: the process said ``succeeded``, the store
    stayed ``running`` (or the carrier crashed and ``wait()`` hung). The task fails, in
    memory and in the store."""
    c = make_controller(store)
    calls: list[int] = []

    @c.task(name="returns", retries=2)
    def returns(token: CancellationToken) -> Any:
        calls.append(1)
        return result

    run = c.submit(returns)
    final = run.wait(10)
    assert final.status is S.FAILED and calls == [1]
    assert final.failure is not None and final.failure.kind is FailureKind.RESULT_INVALID
    stored = c.get(run.task_id)
    assert stored.status is S.FAILED and stored.failure is not None
    assert stored.failure.kind is FailureKind.RESULT_INVALID
    assert c.desynced_tasks == frozenset() and c.held() == []


def test_a_result_is_kept_as_the_store_gives_it_back(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)

    @c.task(name="shaped")
    def shaped(token: CancellationToken) -> Any:
        return {"pair": (1, 2), 3: "three", "text": "a\x00b é"}

    run = c.submit(shaped)
    expected = {"pair": [1, 2], "3": "three", "text": "a\x00b é"}
    assert run.result(5) == expected
    assert c.get(run.task_id).outcome == expected


def test_nul_in_a_result_fails_the_task_where_the_store_cannot_hold_it() -> None:
    strict = InMemoryTaskStore()
    strict.value_rules = STRICT  # type: ignore[misc]
    with Controller(strict) as c:
        run = c.submit(c.task(lambda token: {"k": "a\x00b"}, name="nul"))
        final = run.wait(5)
        assert final.status is S.FAILED and final.failure is not None
        assert final.failure.kind is FailureKind.RESULT_INVALID
        assert "NUL" in final.failure.message


def test_a_failure_message_the_store_cannot_hold_is_made_storable(
    store: TaskStore, make_controller: Make
) -> None:
    """A task's exception is not the user's value to fix: its message is escaped, so the
    failure lands in the store instead of leaving the task ``running`` there."""
    c = make_controller(store)

    @c.task(name="raises")
    def raises(token: CancellationToken) -> None:
        raise ValueError("cannot open report-\udcff.csv" + "x" * 10_000)

    run = c.submit(raises)
    assert run.wait(5).status is S.FAILED
    stored = c.get(run.task_id)
    assert stored.status is S.FAILED and stored.failure is not None
    assert "report-\\udcff.csv" in stored.failure.message
    assert len(stored.failure.message) < 4200


def test_a_crash_of_the_runtime_itself_ends_the_task(
    make_controller: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = make_controller()

    def broken(self: Run, result: Any, *rest: Any) -> None:
        raise RuntimeError("settle broke")

    monkeypatch.setattr(Run, "settle", broken)
    run = c.submit(c.task(lambda token: 1, name="one"))
    final = run.wait(5)
    assert final.status is S.FAILED and final.failure is not None
    assert "settle broke" in final.failure.message
    assert c.get(run.task_id).status is S.FAILED


# -- 3 (continued). names, tags, keys, reasons at submit -----------------------------------------


def test_submit_refuses_names_tags_and_keys_the_store_cannot_hold(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    noop = lambda token: None  # noqa: E731
    with pytest.raises(InvalidValue, match="task name"):
        c.submit(c.task(noop, name="bad-\udcff"))
    with pytest.raises(InvalidValue, match="tag"):
        c.submit(c.task(noop, name="tagged", tags={"caf\udce9"}))
    with pytest.raises(InvalidValue, match="bucket_key"):
        c.task(noop, name="keyed").configure(bucket_key="tenant-\udcff").submit()
    with pytest.raises(InvalidValue, match="bucket_key"):
        c.task(noop, name="keyed2").configure(bucket_key=42).submit()  # type: ignore[arg-type]
    assert sum(store.counts().values()) == 0  # nothing stored
    run = c.submit(c.task(noop, name="fine"))
    run.wait(5)
    with pytest.raises(InvalidValue, match="reason"):
        c.stop(run.task_id, reason="because\udcff")
    held = c.submit(c.task(lambda token: token.sleep(5), name="held"))
    with pytest.raises(InvalidValue, match="reason"):
        held.pause(reason="\udcff")  # the handle's own control checks too
    with pytest.raises(InvalidValue, match="actor"):
        run_of(held).stop(actor="\udcff")  # a command's issuer, checked on the node's side
    assert held.cancel().outcome in ("cancelled", "stopping")
    assert held.wait(5).status is S.CANCELLED
    with pytest.raises(InvalidValue, match="schedule name"):
        from chongming_task import IntervalTrigger

        c.schedule("every-\udcff", "fine", IntervalTrigger(60))


def test_the_owner_and_the_clock_are_checked_when_the_node_is_built() -> None:
    with pytest.raises(InvalidValue, match="owner"):
        Controller(InMemoryTaskStore(), owner="node-\udcff")

    class NaiveClock:
        def now(self) -> datetime:
            return datetime.now()  # the mistake under test

        def monotonic(self) -> float:
            return time.monotonic()

    with pytest.raises(ConfigurationError, match="timezone-aware"):
        Controller(InMemoryTaskStore(), clock=NaiveClock())


def test_a_query_that_is_not_utf8_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not valid UTF-8"):
        TaskQuery(tag="caf\udce9")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        TaskQuery(name_prefix="\udcff")


def test_sqlite_turns_text_it_cannot_bind_into_a_store_error(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    try:
        with pytest.raises(StoreError, match="not valid UTF-8"):
            store.get("\udcff")
        with pytest.raises(StoreError, match="not valid UTF-8"):
            store.history("\udcff")
    finally:
        store.close()


# -- 4. SQLite group commit: one caller's bad row never fails another caller ------------------


def _snapshot(task_id: str, name: str) -> tuple[TaskSnapshot, Transition]:
    now = datetime.now(UTC)
    return (
        TaskSnapshot(task_id=task_id, name=name, status=S.QUEUED, status_version=1, created_at=now),
        Transition(task_id=task_id, version=1, from_status=None, to_status=S.QUEUED, at=now),
    )


def test_group_commit_never_fails_a_caller_for_another_callers_row(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "g.db")
    errors: list[BaseException] = []
    bad_refused = 0
    stop = threading.Event()
    barrier = threading.Barrier(7)

    def good(worker: int) -> None:
        barrier.wait()
        for i in range(150):
            try:
                store.create_many([_snapshot(f"good-{worker}-{i}", "fine")])
            except BaseException as exc:
                errors.append(exc)

    def bad() -> None:
        nonlocal bad_refused
        barrier.wait()
        i = 0
        while not stop.is_set():
            i += 1
            try:
                store.create_many([_snapshot(f"bad-{i}", "bad-\udcff")])
            except StoreError:
                bad_refused += 1

    threads = [threading.Thread(target=good, args=(w,)) for w in range(6)]
    spoiler = threading.Thread(target=bad)
    for t in [*threads, spoiler]:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    spoiler.join(60)
    try:
        assert errors == []
        assert bad_refused > 0
        assert store.counts() == {S.QUEUED: 900}
    finally:
        store.close()


def test_write_transitions_refuses_its_own_bad_row_alone(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "w.db")
    try:
        snapshot, created = _snapshot("t1", "fine")
        store.create_many([(snapshot, created)])
        moved = snapshot.evolve(status=S.STARTING, status_version=2)
        # Built past the checks (a store's own boundary is what is tested here).
        bad = trusted_transition(
            task_id="t1",
            version=2,
            from_status=S.QUEUED,
            to_status=S.STARTING,
            at=created.at,
            reason="\udcff",
            actor=None,
        )
        with pytest.raises(StoreError, match="not valid UTF-8"):
            store.write_transitions(moved, expect_version=1, transitions=[bad])
        assert store.history("t1") == [created]
        assert store.get("t1") == snapshot
    finally:
        store.close()


# -- the value rules themselves -----------------------------------------------------------------


def test_check_json_tells_an_escaped_backslash_from_a_nul() -> None:
    with pytest.raises(InvalidValue):
        check_json({"a": "x\x00"}, "v", STRICT)
    with pytest.raises(InvalidValue):
        check_json({"a\x00": 1}, "v", STRICT)
    assert check_json("\\u0000", "v", STRICT) == '"\\\\u0000"'  # the literal text, no NUL
    assert check_json("x\x00", "v", ValueRules(nul_in_text=True)) == '"x\\u0000"'


def test_storable_text_escapes_and_bounds() -> None:
    assert storable_text("a\udcffb\x00", STRICT) == "a\\udcffb\\x00"
    assert storable_text("a\x00", ValueRules(nul_in_text=True)) == "a\x00"
    assert len(storable_text("x" * 100_000)) < 4100
