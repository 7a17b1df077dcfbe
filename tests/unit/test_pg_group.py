"""The group commit's queue, leaders and hand-over (``stores.postgres.group``), with a stand-in
for the statement: how many run at once, who commits whose write, and that every caller
returns whatever the statement does. The statement itself is tested against a real
server in tests/integration/test_postgres_group_commit.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from chongming_task import StoreError, StoreUnavailable, TaskSnapshot, TaskStatus
from chongming_task.model import Transition
from chongming_task.stores.postgres.group import GroupCommit, GroupWrite, batch_params

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def write(task_id: str) -> GroupWrite:
    snap = TaskSnapshot(
        task_id=task_id, name="n", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )
    created = Transition(
        task_id=task_id, version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
    )
    return GroupWrite(task_id, [created], new=snap)


class Statement:
    """A stand-in statement that takes ``seconds`` and records its batches."""

    def __init__(self, seconds: float = 0.01, fail: BaseException | None = None) -> None:
        self.seconds = seconds
        self.fail = fail
        self.batches: list[list[str]] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, writes: Sequence[GroupWrite]) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.batches.append([w.task_id for w in writes])
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        if self.fail is not None:
            # A fresh exception per statement, as a driver raises: two writes that each
            # went alone must not share one object because the stand-in reused it.
            raise type(self.fail)(*self.fail.args)


def run_writers(group: GroupCommit, count: int) -> dict[str, BaseException | None]:
    outcome: dict[str, BaseException | None] = {}

    def one(n: int) -> None:
        mine = write(f"t{n}")
        try:
            group.run([mine])
        except BaseException as exc:  # an interrupt in the statement reaches its leader
            outcome[f"t{n}"] = exc
        else:
            outcome[f"t{n}"] = mine.error

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(t.is_alive() for t in threads), "a writer never returned"
    return outcome


@pytest.mark.parametrize("leaders", [1, 2, 3])
def test_no_more_statements_in_flight_than_leaders_and_every_write_once(leaders: int) -> None:
    statement = Statement()
    outcome = run_writers(GroupCommit(statement, leaders=leaders), 40)
    assert outcome == {f"t{n}": None for n in range(40)}
    assert statement.most <= leaders
    written = [t for batch in statement.batches for t in batch]
    assert sorted(written) == sorted(outcome)  # each write in exactly one statement
    assert len(statement.batches) < 40  # writers that queued shared a statement


def test_an_outage_fails_each_writer_with_its_own_exception() -> None:
    statement = Statement(fail=StoreUnavailable("server gone"))
    outcome = run_writers(GroupCommit(statement, leaders=1), 12)
    errors = list(outcome.values())
    assert all(isinstance(e, StoreUnavailable) for e in errors)
    assert len({id(e) for e in errors}) == 12  # raised on twelve threads: twelve objects


def test_a_failed_batch_is_redone_one_by_one() -> None:
    """A statement failing as a whole wrote nothing; alone, only the faulty write fails."""
    seen: list[list[str]] = []

    def statement(writes: Sequence[GroupWrite]) -> None:
        seen.append([w.task_id for w in writes])
        time.sleep(0.01)
        if any(w.task_id == "t3" for w in writes):
            raise StoreError("value refused")

    outcome = run_writers(GroupCommit(statement, leaders=1), 8)
    assert isinstance(outcome.pop("t3"), StoreError)
    assert set(outcome.values()) == {None}
    assert ["t3"] in seen


def test_an_interrupt_in_the_statement_reaches_its_leader_and_frees_the_rest() -> None:
    statement = Statement(fail=KeyboardInterrupt())
    outcome = run_writers(GroupCommit(statement, leaders=1), 6)
    kinds = {type(e) for e in outcome.values()}
    assert KeyboardInterrupt in kinds  # the leader that ran it
    assert kinds <= {KeyboardInterrupt, StoreError}  # the others: an error, not a hang


def test_batch_parameters_list_rows_in_task_id_order() -> None:
    """Two batches touching the same tasks lock them in the same order (no deadlock)."""
    which, params = batch_params([write("b"), write("a")])
    assert which == (2, 0, True)  # per row: two new tasks
    assert params.index("a") < params.index("b")
    many = [write(f"t{k:02}") for k in range(12, 0, -1)]
    which, params = batch_params(many)
    assert which == (1, 0, False)  # past eight: JSON rows
    assert params[0].index('"t01"') < params[0].index('"t12"')


def test_statements_are_sent_with_numbered_server_placeholders() -> None:
    from chongming_task.stores.postgres.group import numbered

    assert numbered("SELECT %s, %s::int FROM t WHERE a = %s") == (
        b"SELECT $1, $2::int FROM t WHERE a = $3"
    )
    with pytest.raises(ValueError, match="not a %s placeholder"):
        numbered("SELECT %s WHERE a LIKE 'x%'")


def test_each_shape_has_one_placeholder_per_parameter() -> None:
    """Every statement shape takes exactly the parameters ``batch_params`` gives it."""
    import re

    pytest.importorskip("psycopg")
    from chongming_task.stores.postgres.group import group_statements
    from chongming_task.stores.postgres.schema import statements_in
    from chongming_task.stores.sql import load_named

    statements = group_statements(statements_in(load_named("chongming_task.stores.postgres"), "s"))

    def life(task_id: str) -> GroupWrite:
        snap = TaskSnapshot(
            task_id=task_id,
            name="j",
            status=TaskStatus.RUNNING,
            status_version=3,
            created_at=T0,
        )
        return GroupWrite(task_id, [], life=snap, expect=1)

    batches = [[write(f"n{k}") for k in range(n)] for n in (1, 3, 8, 9)]
    batches += [[life(f"l{k}") for k in range(n)] for n in (1, 2, 5, 8, 9)]
    batches += [[write("n"), life("l")], [*(write(f"n{k}") for k in range(5)), life("l")]]
    batches.append([*(write(f"n{k}") for k in range(5)), *(life(f"l{k}") for k in range(5))])
    batches.append([GroupWrite("t", [])])
    seen = set()
    for batch in batches:
        which, params = batch_params(batch)
        seen.add(which)
        placeholders = {int(n) for n in re.findall(rb"\$(\d+)", statements[which])}
        assert placeholders == set(range(1, len(params) + 1)), which
    assert len(seen) == len(batches)


def test_one_caller_writes_several_in_one_batch_and_leads_a_write_handed_to_it() -> None:
    """``run`` queues a caller's writes together. When other leaders hand the lead to
    both of its writes before it takes its first batch, it leads each in turn: every
    write settles exactly once, the caller returns, and the leader count comes back."""
    gates = {"a": threading.Event(), "b": threading.Event()}
    may_take = threading.Event()
    batches: list[list[str]] = []

    def statement(writes: Sequence[GroupWrite]) -> None:
        batches.append([w.task_id for w in writes])
        gate = gates.get(writes[0].task_id)
        if gate is not None:
            gate.wait(10)

    class HeldTake(GroupCommit):
        def _take(self, own: GroupWrite) -> list[GroupWrite]:
            if own.task_id == "c1":
                may_take.wait(10)
            return super()._take(own)

    group = HeldTake(statement, leaders=2)
    leaders = [threading.Thread(target=group.run, args=([write(t)],)) for t in ("a", "b")]
    for thread in leaders:
        thread.start()
    while len(batches) < 2:  # both leaders are inside their statements
        time.sleep(0.001)
    mine = [write("c1"), write("c2")]
    raised: list[BaseException] = []

    def call() -> None:
        try:
            group.run(mine)
        except BaseException as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    while group.queued < 2:
        time.sleep(0.001)
    gates["a"].set()  # a's leader hands the lead to c1; the caller waits to take
    leaders[0].join(10)
    gates["b"].set()  # b's leader hands the lead to c2
    leaders[1].join(10)
    assert mine[1].leads
    may_take.set()
    caller.join(10)
    assert not caller.is_alive() and raised == []
    assert all(w.settled and w.error is None for w in mine)
    assert sorted(t for batch in batches for t in batch) == ["a", "b", "c1", "c2"]
    assert group.leading == 0 and not group.queued


def test_several_writes_of_one_caller_usually_share_one_statement() -> None:
    statement = Statement(seconds=0)
    group = GroupCommit(statement, leaders=2)
    mine = [write("x"), write("y"), write("z")]
    group.run(mine)
    assert statement.batches == [["x", "y", "z"]]
    assert all(w.settled and w.error is None for w in mine)


def test_writes_queued_behind_ride_the_next_callers_statement() -> None:
    """Queued behind, nothing is committed; the next caller's statement carries them,
    and that caller returns after its one statement."""
    statement = Statement(seconds=0)
    group = GroupCommit(statement, leaders=2)
    ends = [write("e1"), write("e2")]
    pending = group.behind(ends)
    assert not pending.settled and statement.batches == []
    mine = write("s1")
    group.run([mine])
    assert statement.batches == [["s1", "e1", "e2"]]
    assert pending.settled and pending.errors() == [None, None]
    assert mine.settled and mine.error is None


def test_serve_commits_on_its_thread_only_when_no_statement_is_in_flight() -> None:
    gate = threading.Event()
    batches: list[list[str]] = []

    def statement(writes: Sequence[GroupWrite]) -> None:
        batches.append([w.task_id for w in writes])
        if writes[0].task_id == "slow":
            gate.wait(10)

    group = GroupCommit(statement, leaders=2)
    leader = threading.Thread(target=group.run, args=([write("slow")],))
    leader.start()
    while not batches:  # the caller's statement is in flight
        time.sleep(0.001)
    pending = group.behind([write("end")])
    began = time.monotonic()
    pending.serve()  # a statement is in flight: it returns at once, nothing committed
    assert time.monotonic() - began < 1.0 and not pending.settled
    gate.set()
    leader.join(10)
    # The leader took its batch before the end was queued, and hands no lead to it.
    assert batches == [["slow"]] and not pending.settled
    pending.serve()  # nothing in flight now: committed here
    assert pending.settled and pending.errors() == [None]
    assert batches == [["slow"], ["end"]]
    assert group.leading == 0 and not group.queued


def test_wait_sees_writes_behind_through_whoever_commits_them() -> None:
    """``wait()`` commits them itself, or waits for a leader in flight and commits
    what it left; it returns once settled, and again at once."""
    gate = threading.Event()

    def statement(writes: Sequence[GroupWrite]) -> None:
        if writes[0].task_id == "slow":
            gate.wait(10)

    group = GroupCommit(statement, leaders=1)
    leader = threading.Thread(target=group.run, args=([write("slow")],))
    leader.start()
    while not group.leading:
        time.sleep(0.001)
    pending = group.behind([write("a"), write("b")])
    threading.Timer(0.05, gate.set).start()
    pending.wait()
    assert pending.settled and pending.errors() == [None, None]
    pending.wait()  # settled: at once
    leader.join(10)
    assert group.leading == 0


def test_an_outage_fails_each_write_behind_with_its_own_exception() -> None:
    statement = Statement(seconds=0, fail=StoreUnavailable("server gone"))
    group = GroupCommit(statement, leaders=2)
    pending = group.behind([write("a"), write("b")])
    pending.wait()
    first, second = pending.errors()
    assert isinstance(first, StoreUnavailable) and isinstance(second, StoreUnavailable)
    assert first is not second


def test_nothing_queued_behind_is_settled_at_once() -> None:
    group = GroupCommit(Statement(seconds=0), leaders=1)
    pending = group.behind([])
    assert pending.settled and pending.errors() == []
    pending.serve()
    pending.wait()
    assert group.leading == 0 and not group.queued
