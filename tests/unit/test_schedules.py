"""Schedules driven by a fake clock: no sleeping, every firing time exact."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    Controller,
    CronTrigger,
    InMemoryTaskStore,
    IntervalTrigger,
    InvalidValue,
    TaskQuery,
)
from chongming_task.testing import FakeClock

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Make = Callable[..., Controller]


def node(make_controller: Make, clock: FakeClock, **kwargs: object) -> Controller:
    c = make_controller(InMemoryTaskStore(), clock=clock, run_schedules=False, **kwargs)
    c.task(lambda token: "tick", name="tick")
    return c


def test_interval_firings_happen_at_exact_times(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    entry = c.schedule("every-10s", "tick", IntervalTrigger(10))
    assert entry.next_fire == T0 + timedelta(seconds=10)
    assert c.tick_schedules() == []  # not due yet
    fired_at = []
    for _ in range(3):
        clock.advance(9.999)
        assert c.tick_schedules() == []
        clock.advance(0.001)
        (run,) = c.tick_schedules()
        fired_at.append(run.snapshot().created_at)
        run.wait(5)
    assert fired_at == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    stored = c.list_tasks(TaskQuery(tag="schedule:every-10s"))
    assert len(stored) == 3 and all(s.name == "tick" for s in stored)


def test_cron_fires_at_wall_clock_times_across_dst_changes() -> None:
    berlin = CronTrigger("30 2 * * *", timezone="Europe/Berlin")
    fires, t = [], datetime(2026, 3, 27, 12, 0, tzinfo=UTC)
    for _ in range(4):
        t = berlin.next_after(t)
        fires.append(t)
    assert fires == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # 02:30 does not exist: 03:30 CEST
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    ]
    hourly = CronTrigger("0 * * * *", timezone="Europe/Berlin")
    t, fires = datetime(2026, 10, 24, 23, 30, tzinfo=UTC), []
    for _ in range(4):
        t = hourly.next_after(t)
        fires.append(t)
    # 02:00 happens twice on 25 Oct (CEST, then CET): it fires once, at the first.
    assert fires == [
        datetime(2026, 10, 25, 0, 0, tzinfo=UTC),  # 02:00 CEST
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),  # 03:00 CET
        datetime(2026, 10, 25, 3, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 4, 0, tzinfo=UTC),
    ]


def test_cron_through_the_scheduler_with_a_fake_clock_across_spring_forward(
    make_controller: Make,
) -> None:
    clock = FakeClock(datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
    c = node(make_controller, clock)
    entry = c.schedule("nightly", "tick", CronTrigger("30 2 * * *", timezone="Europe/Berlin"))
    fired = []
    for _ in range(3):
        assert entry.due is not None
        clock.set(entry.due)
        (run,) = c.tick_schedules()
        fired.append(run.wait(5).created_at)  # let it finish: overlap would skip otherwise
    assert fired == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
    ]


def test_cron_fields_and_errors() -> None:
    t = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)  # a Monday
    weekdays = CronTrigger("*/15 9-10 * * mon-fri")
    assert weekdays.next_after(t) == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert weekdays.next_after(datetime(2026, 3, 2, 10, 45, tzinfo=UTC)) == datetime(
        2026, 3, 3, 9, 0, tzinfo=UTC
    )
    assert CronTrigger("0 0 * * sun").next_after(t) == datetime(2026, 3, 8, tzinfo=UTC)
    assert CronTrigger("0 0 * * 7").next_after(t) == datetime(2026, 3, 8, tzinfo=UTC)
    assert CronTrigger("@monthly").next_after(t) == datetime(2026, 4, 1, tzinfo=UTC)
    assert CronTrigger("0 12 29 feb *").next_after(t) == datetime(2028, 2, 29, 12, tzinfo=UTC)
    # Both day fields restricted: either matches (the 13th, or any Friday).
    either = CronTrigger("0 0 13 * fri")
    assert either.next_after(t) == datetime(2026, 3, 6, tzinfo=UTC)
    assert either.latest_at_or_before(datetime(2026, 3, 14, tzinfo=UTC)) == datetime(
        2026, 3, 13, tzinfo=UTC
    )
    for bad, message in [
        ("* * * *", "needs 5 fields"),
        ("61 * * * *", "outside 0-59"),
        ("x * * * *", "not valid"),
        ("0 0 31 2 *", "never fires"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            CronTrigger(bad).next_after(t)
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        CronTrigger("* * * * *", timezone="Mars/Olympus")


def test_overlap_skips_a_firing_while_the_previous_run_is_active(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    release = threading.Event()

    @c.task(name="long")
    def long(token: CancellationToken) -> None:
        release.wait(10)

    entry = c.schedule("long-job", "long", IntervalTrigger(10))
    clock.advance(10)
    (first,) = c.tick_schedules()
    clock.advance(10)
    assert c.tick_schedules() == [] and entry.skipped_overlap == 1
    release.set()
    first.wait(5)
    clock.advance(10)
    assert len(c.tick_schedules()) == 1 and entry.fired == 2


def test_overlap_allow_fires_anyway(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    release = threading.Event()
    c.task(lambda token: release.wait(10), name="long")
    entry = c.schedule("parallel", "long", IntervalTrigger(10), overlap="allow")
    for _ in range(2):
        clock.advance(10)
        assert len(c.tick_schedules()) == 1
    assert entry.fired == 2 and entry.skipped_overlap == 0
    release.set()


def test_a_gap_in_ticks_runs_one_catch_up_firing_not_many(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    entry = c.schedule("every-10s", "tick", IntervalTrigger(10))
    clock.advance(10)
    (first,) = c.tick_schedules()
    first.wait(5)
    clock.advance(95)  # downtime: 9 firings missed (t=20..100)
    (catch_up,) = c.tick_schedules()
    catch_up.wait(5)
    assert entry.next_fire == T0 + timedelta(seconds=110)
    clock.advance(5)
    assert len(c.tick_schedules()) == 1
    assert entry.fired == 3 and entry.skipped_overlap == 0


def test_misfire_grace_skips_a_firing_that_is_too_late(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    entry = c.schedule("daily", "tick", CronTrigger("0 6 * * *"), misfire_grace=60)
    clock.set(datetime(2026, 3, 2, 6, 0, 30, tzinfo=UTC))
    (run,) = c.tick_schedules()  # 30 s late: within grace
    run.wait(5)
    clock.set(datetime(2026, 3, 3, 9, 0, tzinfo=UTC))
    assert c.tick_schedules() == [] and entry.skipped_misfire == 1  # 3 h late
    assert entry.next_fire == datetime(2026, 3, 4, 6, 0, tzinfo=UTC)


def test_jitter_delays_each_firing_within_bounds(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock, seed=3)
    entry = c.schedule("jittery", "tick", IntervalTrigger(60), jitter=5)
    delays = []
    for _ in range(20):
        assert entry.due is not None and entry.next_fire is not None
        delays.append((entry.due - entry.next_fire).total_seconds())
        clock.set(entry.due)
        (run,) = c.tick_schedules()
        run.wait(5)
    assert all(0 <= d <= 5 for d in delays) and len(set(delays)) > 10


def test_firings_are_normal_submits_and_only_the_buckets_owner_fires(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock, owned_buckets=range(0, 8))
    policy = c.bucket_policy
    mine = next(k for k in (f"k{i}" for i in range(999)) if policy.bucket_for(k) < 8)
    theirs = next(k for k in (f"k{i}" for i in range(999)) if policy.bucket_for(k) >= 8)
    # Kept, never fired here: its slots are the owner's of the key's bucket.
    elsewhere = c.schedule("elsewhere", "tick", IntervalTrigger(10), bucket_key=theirs)
    c.schedule("tenant", "tick", IntervalTrigger(10), bucket_key=mine, tags={"nightly"})
    clock.advance(10)
    (run,) = c.tick_schedules()
    snapshot = run.wait(5)
    assert snapshot.bucket_key == mine and snapshot.tags >= {"nightly", "schedule:tenant"}
    assert elsewhere.fired == 0 and elsewhere.skipped_elsewhere == 1
    assert elsewhere.next_fire == T0 + timedelta(seconds=20)


def test_no_firing_after_close(make_controller: Make) -> None:
    clock = FakeClock(T0)
    c = node(make_controller, clock)
    c.schedule("every-10s", "tick", IntervalTrigger(10))
    c.close()
    clock.advance(100)
    assert c.tick_schedules() == []
    assert c.list_tasks() == []


def test_the_scheduler_thread_starts_with_the_controller_and_stops_on_close() -> None:
    c = Controller(InMemoryTaskStore())
    c.task(lambda token: "tick", name="tick")
    c.schedule("fast", "tick", IntervalTrigger(0.05))
    done = threading.Event()
    while len(c.list_tasks()) < 2 and not done.wait(0.01):
        pass
    c.close()
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("chongming-scheduler")]
    count = len(c.list_tasks())
    done.wait(0.2)
    assert len(c.list_tasks()) == count >= 2  # nothing fired after close


def test_a_schedule_fires_with_its_priority_and_dedupe_key(make_controller: Make) -> None:
    """Each firing carries the schedule's priority and dedupe key; a firing whose key a
    task still holds answers with that task (overlap="allow" lets it fire at all)."""
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    c = make_controller(store, clock=clock, run_schedules=False)
    gate = threading.Event()
    c.task(lambda token: gate.wait(10), name="hold")
    c.schedule(
        "nightly", "hold", IntervalTrigger(10), overlap="allow", priority=3, dedupe_key="night"
    )
    clock.advance(10)
    (first,) = c.tick_schedules()
    stored = store.get(first.task_id)
    assert stored is not None and stored.priority == 3 and stored.dedupe_key == "night"
    clock.advance(10)
    (again,) = c.tick_schedules()
    assert again == first  # the key is still held: no second task
    assert len(store.query()) == 1
    gate.set()
    first.wait(10)
    clock.advance(10)
    (third,) = c.tick_schedules()
    assert third.task_id != first.task_id and len(store.query()) == 2
    with pytest.raises(InvalidValue, match="priority"):
        c.schedule("bad", "hold", IntervalTrigger(10), priority=1.5)  # type: ignore[arg-type]
    # Checked when the schedule is made, not at its first firing.
    with pytest.raises(InvalidValue, match="dedupe_key"):
        c.schedule("bad", "hold", IntervalTrigger(10), dedupe_key="lone \ud800")
    assert [e.name for e in c.schedules] == ["nightly"]


def test_two_nodes_defining_one_schedule_fire_each_slot_once(make_controller: Make) -> None:
    clock = FakeClock(T0 + timedelta(seconds=3))  # between slots: both reach the same ones
    store = InMemoryTaskStore()
    nodes = []
    for owner in ("node-a", "node-b"):
        c = make_controller(store, clock=clock, run_schedules=False, owner=owner)
        c.task(lambda token: "tick", name="tick")
        nodes.append((c, c.schedule("every-10s", "tick", IntervalTrigger(10))))
    (a, on_a), (b, on_b) = nodes
    assert on_a.next_fire == on_b.next_fire == T0 + timedelta(seconds=10)
    for step in range(4):
        clock.advance(10)
        first, second = (a, b) if step % 2 == 0 else (b, a)
        (run,) = first.tick_schedules()
        assert second.tick_schedules() == []
        run.wait(5)
    ran = store.query(TaskQuery(tag="schedule:every-10s"))
    assert len(ran) == 4
    assert sorted(t.created_at for t in ran) == [
        T0 + timedelta(seconds=s) for s in (13, 23, 33, 43)
    ]
    assert (on_a.fired, on_a.taken, on_b.fired, on_b.taken) == (2, 2, 2, 2)
    assert on_a.last_taken_by == "node-b" and on_b.last_taken_by == "node-a"


def test_a_slot_another_node_fired_counts_for_overlap(make_controller: Make) -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    gate = threading.Event()
    nodes = []
    for owner in ("node-a", "node-b"):
        c = make_controller(store, clock=clock, run_schedules=False, owner=owner)
        c.task(lambda token: gate.wait(10), name="long")
        nodes.append((c, c.schedule("long-job", "long", IntervalTrigger(10))))
    (a, on_a), (b, on_b) = nodes
    clock.advance(10)
    (first,) = a.tick_schedules()
    assert b.tick_schedules() == [] and on_b.taken == 1
    clock.advance(10)  # still running on node-a: neither fires
    assert b.tick_schedules() == [] and a.tick_schedules() == []
    assert on_b.skipped_overlap == on_a.skipped_overlap == 1
    gate.set()
    first.wait(5)
    clock.advance(10)
    (again,) = b.tick_schedules()
    again.wait(5)
    assert len(store.query(TaskQuery(tag="schedule:long-job"))) == 2
