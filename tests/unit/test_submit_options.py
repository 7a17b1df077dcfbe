"""``task.configure(...)``: delayed and timed tasks and priorities, on every built-in
store; bad options refused with nothing stored; an older SQLite file gains the option
columns with its tasks kept."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    ControlOutcome,
    InMemoryTaskStore,
    IntervalTrigger,
    InvalidValue,
    SqliteTaskStore,
    TaskAlreadyExists,
    TaskStatus,
)
from chongming_task.present import ps_rows, show_text
from chongming_task.run.stored import StoredTask
from chongming_task.stores import codec
from chongming_task.stores.protocol import TaskStore
from chongming_task.stores.sqlite import SCHEMA_VERSION
from tests.conftest import here
from tests.unit.older_files import older_file

S = TaskStatus


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TaskStore:
    if request.param == "memory":
        return InMemoryTaskStore()
    return SqliteTaskStore(tmp_path / "options.db")


def echo(token: CancellationToken, x: str) -> str:
    return x


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"run_at": datetime(2030, 1, 1)}, "aware datetime"),  # naive on purpose
        ({"delay": -1}, ">= 0"),
        ({"delay": float("nan")}, "finite"),
        ({"delay": float("inf")}, "finite"),
        ({"delay": "5"}, "number of seconds"),
        ({"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
        ({"priority": 1.5}, "priority must be an int"),
        ({"priority": True}, "priority must be an int"),
        ({"priority": 2**31}, "32 bits"),
        ({"tags": "urgent"}, "iterable of text"),
        ({"tags": [1]}, "iterable of text"),
        ({"dedupe_key": 5}, "dedupe_key must be text"),
        ({"dedupe_key": "k", "on_duplicate": "skip"}, "on_duplicate"),
        ({"dedupe_key": "k", "dedupe_window": 0}, "> 0"),
        ({"dedupe_key": "k", "dedupe_window": float("nan")}, "finite"),
        ({"dedupe_window": 5}, "needs a dedupe_key"),
    ],
)
def test_a_bad_option_is_refused_where_it_is_given_and_nothing_is_stored(
    store: TaskStore, options: dict[str, object], says: str
) -> None:
    with Controller(store) as node:
        node.task(echo, name="echo")
        with pytest.raises(InvalidValue, match=says):
            node.tasks["echo"].configure(**options).submit("x")  # type: ignore[arg-type]
        assert store.query() == []


def test_an_unknown_option_is_pythons_own_type_error(store: TaskStore) -> None:
    with Controller(store) as node:
        with pytest.raises(TypeError, match="priorty"):
            node.task(echo, name="echo").configure(priorty=3)  # type: ignore[call-arg]
        # The task's own keyword arguments never meet the options.
        node.task(echo, name="echo")
        assert node.tasks["echo"].configure(priority=1).submit(x="delay").result(10) == "delay"


def test_a_delayed_task_waits_queued_with_its_time_then_runs(store: TaskStore) -> None:
    with Controller(store, lease_ttl=2.0) as node:
        node.task(echo, name="echo")
        asked = datetime.now(UTC)
        run = node.tasks["echo"].configure(delay=0.6, priority=3, tags=["later"]).submit("done")
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is S.QUEUED
        assert stored.run_at is not None and stored.priority == 3 and "later" in stored.tags
        assert timedelta(seconds=0.5) < stored.run_at - asked < timedelta(seconds=1)
        # Its lease runs a TTL past its time: nothing renews it while it waits.
        assert stored.lease_until is not None
        leased = (stored.lease_until - stored.run_at).total_seconds()
        assert leased == pytest.approx(2.0, abs=0.1)
        now = datetime.now(UTC)
        assert "runs at" in show_text(stored, now) and "priority" in show_text(stored, now)
        (row,) = ps_rows([stored], now)[1]
        assert row[2].startswith("queued (runs at ") and row[2].endswith("in 0s)"), row[2]
        assert run.result(10) == "done"
        started = store.get(run.task_id).started_at  # type: ignore[union-attr]
        assert started is not None and started >= stored.run_at
        assert codec.snapshot_to_row(store.get(run.task_id))["run_at"] is not None  # type: ignore[arg-type]


def test_a_time_already_past_runs_at_once_and_submit_many_takes_options(
    store: TaskStore,
) -> None:
    with Controller(store) as node:
        node.task(echo, name="echo")
        past = datetime.now(UTC) - timedelta(hours=1)
        run = node.tasks["echo"].configure(run_at=past.astimezone(timezone_east())).submit("now")
        assert run.result(10) == "now"
        stored_at = store.get(run.task_id).run_at  # type: ignore[union-attr]
        assert stored_at == past and stored_at.tzinfo is UTC  # type: ignore[union-attr]
        runs = node.tasks["echo"].configure(priority=-2, delay=0.1).submit_many([("a",), ("b",)])
        assert [r.result(10) for r in runs] == ["a", "b"]
        assert {store.get(r.task_id).priority for r in runs} == {-2}  # type: ignore[union-attr]


def timezone_east() -> object:
    from datetime import timezone

    return timezone(timedelta(hours=8))


def test_a_delayed_task_cancelled_before_its_time_never_runs(store: TaskStore) -> None:
    ran: list[str] = []

    def record(token: CancellationToken) -> None:
        ran.append(here().task_id)

    with Controller(store) as node:
        node.task(record, name="record")
        run = node.tasks["record"].configure(delay=1.0).submit()
        assert node.cancel(run.task_id).outcome.value == "cancelled"
        time.sleep(1.3)  # past its time
        assert run.status is S.CANCELLED and ran == []
        assert store.get(run.task_id).status is S.CANCELLED  # type: ignore[union-attr]


def test_higher_priorities_start_first_and_one_priority_in_arrival_order(
    store: TaskStore,
) -> None:
    started: list[str] = []
    gate = threading.Event()

    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    def note(token: CancellationToken, label: str) -> None:
        started.append(label)

    with Controller(store, max_workers=1) as node:
        node.task(hold, name="hold")
        node.task(note, name="note")
        blocker = node.tasks["hold"].submit()
        while blocker.status is not S.RUNNING:
            time.sleep(0.005)
        for label, priority in [("low", -5), ("first-0", 0), ("top", 9), ("second-0", 0)]:
            node.tasks["note"].configure(priority=priority).submit(label)
        node.tasks["note"].configure(priority=9).submit("top-later")
        gate.set()
        assert node.wait_idle(10)
    assert started == ["top", "top-later", "first-0", "second-0", "low"]


def test_a_schema_12_file_with_tasks_gains_the_option_columns(tmp_path: Path) -> None:
    """A file as the release before the option columns made it, with a task and its
    trail: opened, it is upgraded in place; the task reads as submitted without options
    and a new one keeps its own."""
    path = tmp_path / "v12.db"
    old = [c for c in codec.TASK_COLUMNS if c not in (*codec.OPTION_COLUMNS, "trace_context")]
    at = codec.encode_dt(datetime(2026, 1, 1, tzinfo=UTC))
    values = ["old", "echo", "succeeded", 1, 1, "[]", None, None, None, "n", at]
    values += [at, at, None, None, None, '"kept"', None, None]
    older_file(path, 12, old, values)
    store = SqliteTaskStore(path, create=False)
    try:
        kept = store.get("old")
        assert kept is not None and kept.outcome == "kept" and kept.status is S.SUCCEEDED
        assert (kept.run_at, kept.priority, kept.dedupe_key, kept.concurrency_key) == (
            None,
            0,
            None,
            None,
        )
        assert [t.reason for t in store.history("old")] == ["made by the older release"]
        with Controller(store) as node:
            node.task(echo, name="echo")
            run = node.tasks["echo"].configure(priority=4, delay=0.05).submit("new")
            assert run.result(10) == "new"
        assert store.get(run.task_id).priority == 4  # type: ignore[union-attr]
    finally:
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    plan = check.execute(
        "EXPLAIN QUERY PLAN SELECT task_id FROM tasks WHERE dedupe_key = 'k'"
    ).fetchall()
    check.close()
    assert "idx_tasks_dedupe" in str(plan)


def test_a_dedupe_key_answers_a_duplicate_with_the_task_that_holds_it(store: TaskStore) -> None:
    gate = threading.Event()

    def slow(token: CancellationToken, x: str) -> str:
        gate.wait(10)
        return x

    with Controller(store) as node:
        node.task(slow, name="slow")
        first = node.tasks["slow"].configure(dedupe_key="invoice-7").submit("a")
        assert (
            node.tasks["slow"].configure(dedupe_key="invoice-7").submit("b") == first
        )  # held here
        with pytest.raises(TaskAlreadyExists, match="invoice-7"):
            node.tasks["slow"].configure(dedupe_key="invoice-7", on_duplicate="raise").submit("c")
        assert [s.task_id for s in store.query() if s.dedupe_key == "invoice-7"] == [first.task_id]
        gate.set()
        assert first.result(10) == "a"
        again = node.tasks["slow"].configure(dedupe_key="invoice-7").submit("d")  # free once ended
        assert again.task_id != first.task_id and again.result(10) == "d"
        # A success with a window keeps its key that long.
        daily = node.tasks["slow"].configure(dedupe_key="daily", dedupe_window=30).submit("e")
        assert daily.result(10) == "e"
        assert node.tasks["slow"].configure(dedupe_key="daily").submit("f").task_id == daily.task_id
        assert store.get(daily.task_id).dedupe_window == 30  # type: ignore[union-attr]


def test_a_duplicate_of_another_nodes_task_follows_it_in_the_store(tmp_path: Path) -> None:
    gate = threading.Event()

    def slow(token: CancellationToken) -> str:
        gate.wait(10)
        return "theirs"

    path = tmp_path / "shared.db"
    with (
        Controller(SqliteTaskStore(path), owner="holder") as holder,
        Controller(SqliteTaskStore(path), owner="other") as other,
    ):
        holder.task(slow, name="slow")
        other.task(slow, name="slow")
        held = holder.tasks["slow"].configure(dedupe_key="nightly").submit()
        follow = other.tasks["slow"].configure(dedupe_key="nightly").submit()
        assert isinstance(follow, StoredTask) and follow.task_id == held.task_id
        assert follow.snapshot().status in (S.RUNNING, S.QUEUED)
        pending = follow.pause()  # for its holder: a command, carried out there
        assert pending.accepted and pending.task_id == held.task_id
        gate.set()
        assert follow.result(10) == "theirs" and follow.done()
        ended = follow.stop()
        assert ended.outcome is ControlOutcome.ALREADY_TERMINAL and not ended.accepted
        assert asyncio.run(follow.aresult(5)) == "theirs"
        assert follow.history()[-1].to_status is S.SUCCEEDED


@pytest.mark.parametrize("fair", [False, True], ids=["fifo", "per-bucket limit"])
def test_max_per_key_holds_back_runs_sharing_a_key(store: TaskStore, fair: bool) -> None:
    lock = threading.Lock()
    running: dict[str, int] = {"a": 0, "b": 0, "-": 0}
    peak: dict[str, int] = {"a": 0, "b": 0, "-": 0}

    def work(token: CancellationToken, key: str) -> None:
        with lock:
            running[key] += 1
            peak[key] = max(peak[key], running[key])
        time.sleep(0.05)
        with lock:
            running[key] -= 1

    limit = {"max_parallel_per_bucket": 8} if fair else {}
    with Controller(store, max_workers=8, **limit) as node:  # type: ignore[arg-type]
        node.task(work, name="work", max_per_key=2)
        runs = [node.tasks["work"].configure(concurrency_key=k).submit(k) for k in "aaaaaabbb"]
        runs += [node.tasks["work"].submit("-") for _ in range(3)]  # no key: no limit
        assert all(r.wait(20).status is S.SUCCEEDED for r in runs)
    assert peak == {"a": 2, "b": 2, "-": 3}
    assert {store.get(r.task_id).concurrency_key for r in runs} == {"a", "b", None}  # type: ignore[union-attr]


def test_max_per_key_counts_async_tasks_and_is_checked(store: TaskStore) -> None:
    import asyncio

    from chongming_task import ConfigurationError

    active, peak = [0], [0]

    async def call(token: CancellationToken) -> None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await token.asleep(0.03)
        active[0] -= 1

    with Controller(store) as node:
        node.task(call, name="call", max_per_key=1)
        runs = [node.tasks["call"].configure(concurrency_key="api").submit() for _ in range(4)]
        assert all(r.wait(20).status is S.SUCCEEDED for r in runs)
        assert peak == [1]
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ConfigurationError, match="max_per_key"):
                node.task(call, name=f"bad-{bad}", max_per_key=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidValue, match="concurrency_key must be text"):
            node.tasks["call"].configure(concurrency_key=7).submit()  # type: ignore[arg-type]
        assert len(store.query()) == 4
    assert asyncio.iscoroutinefunction(call)


def test_a_pause_holds_a_delayed_task_past_its_time_until_it_is_resumed(
    store: TaskStore,
) -> None:
    ran: list[float] = []

    def note(token: CancellationToken) -> str:
        ran.append(time.monotonic())
        return "ran"

    with Controller(store) as node:
        node.task(note, name="note")
        run = node.tasks["note"].configure(delay=1.0).submit()
        assert node.pause(run.task_id).outcome.value == "pause-pending"
        time.sleep(1.4)  # well past its time: held, never started
        assert ran == [] and store.get(run.task_id).status is S.QUEUED  # type: ignore[union-attr]
        resumed = time.monotonic()
        assert node.resume(run.task_id).outcome.value == "resumed"
        assert run.result(10) == "ran" and ran[0] >= resumed
        trail = [t.to_status for t in store.history(run.task_id)]
        assert S.PAUSING not in trail and trail[-1] is S.SUCCEEDED


def test_sqlite_refuses_a_held_key_in_a_batch_too_big_for_one_statement(tmp_path: Path) -> None:
    """Past 64 rows a batch goes straight into the tables, not through the write view's
    trigger: each key is checked there too, against the batch's own rows as well."""
    from chongming_task.model import Transition

    store = SqliteTaskStore(tmp_path / "big.db")
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def item(n: int, key: str | None) -> tuple[object, Transition]:
        snap = codec.values_to_snapshot(
            [f"b{n}", "job", "queued", 1, 0, "[]", None, None, None, "n", codec.encode_dt(at)]
            + [None] * 8
            + [None, 0, key, None, None, None]
        )
        return snap, Transition(
            task_id=f"b{n}", version=1, from_status=None, to_status=S.QUEUED, at=at
        )

    try:
        twice = [item(n, f"k{n % 69}") for n in range(70)]  # b0 and b69 share k0
        with pytest.raises(TaskAlreadyExists):
            store.create_many(twice)  # type: ignore[arg-type]
        assert store.query() == []
        store.create_many([item(n, f"k{n}") for n in range(70)])  # type: ignore[arg-type]
        assert len(store.query()) == 70
        with pytest.raises(TaskAlreadyExists):
            store.create_many([item(100 + n, f"new{n}") for n in range(69)] + [item(200, "k5")])  # type: ignore[arg-type]
        assert len(store.query()) == 70
    finally:
        store.close()


def test_options_submit_from_an_event_loop(store: TaskStore) -> None:
    import asyncio

    gate = threading.Event()

    def held(token: CancellationToken, x: str) -> str:
        gate.wait(10)
        return x

    async def main(node: Controller) -> object:
        run = await node.tasks["held"].configure(priority=2, dedupe_key="from-loop").asubmit("hi")
        again = await node.tasks["held"].configure(dedupe_key="from-loop").asubmit("other")
        assert again == run  # still running here: the duplicate answers with it
        gate.set()
        return await run.aresult(10)

    with Controller(store) as node:
        node.task(held, name="held")
        assert asyncio.run(main(node)) == "hi"


def test_pruning_a_finished_deduplicated_task_leaves_its_key_free(store: TaskStore) -> None:
    with Controller(store) as node:
        node.task(echo, name="echo")
        first = node.tasks["echo"].configure(dedupe_key="once").submit("a")
        assert first.result(10) == "a"
        assert store.prune(keep_terminal=0) == 1
        again = node.tasks["echo"].configure(dedupe_key="once").submit("b")
        assert again.task_id != first.task_id and again.result(10) == "b"


def test_arguments_the_function_cannot_take_are_refused_at_submit() -> None:
    """A missing, extra or misspelt argument (an option's name given to the options
    submitter, say) is a TypeError at submit naming the task: nothing is stored, and no
    worker fails on it after its retries."""
    node = Controller(InMemoryTaskStore(), owner="args")
    try:

        @node.task(name="export", retries=3)
        def export(token: CancellationToken, customer: str, *, fmt: str = "csv") -> str:
            return f"{customer}.{fmt}"

        @node.task(name="pair")
        def pair(token: CancellationToken, a: int, b: int) -> int:
            return a + b

        refused = [
            lambda: node.submit(export),  # missing
            lambda: node.submit(export, "c1", "extra"),  # one too many
            lambda: node.submit(export, "c1", fromat="json"),  # misspelt
            lambda: export.configure(tags={"x"}).submit("c1", bucket_key="c1"),
            lambda: node.submit(export, "c1", bucket_key="c1"),  # an option's name
            lambda: node.submit_many(pair, [(1, 2), (1,)]),  # one call of the batch
            lambda: node.schedule("nightly", pair, IntervalTrigger(seconds=60), args=(1,)),
            lambda: export.submit("c1", priority=3),
        ]
        for submit in refused:
            with pytest.raises(TypeError, match=r"task (export|pair): .*nothing was submitted"):
                submit()
        with pytest.raises(TypeError, match=r"bucket_key is an option, given as task\.configure"):
            export.configure(tags={"x"}).submit("c1", bucket_key="c1")
        assert node.store.query() == []  # nothing stored, nothing to fail later
        assert node.submit(export, "c1", fmt="json").result(timeout=10) == "c1.json"
        assert node.submit(pair, 1, b=2).result(timeout=10) == 3
    finally:
        node.close()
