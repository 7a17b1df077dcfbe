"""The records' generated fast paths (``TaskSnapshot.evolve``, the trusted builders) keep
the contract of the dataclasses they stand in for: the same values, frozen, checked."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest

from chongming_task.model import (
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
    snapshot_changer,
    submitted_snapshot,
    trusted_snapshot,
    trusted_transition,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _snapshot() -> TaskSnapshot:
    return TaskSnapshot(
        task_id="t1", name="job", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )


def test_evolve_is_dataclasses_replace_for_every_field() -> None:
    base = _snapshot()
    changes = {
        "status": TaskStatus.RUNNING,
        "status_version": 3,
        "attempt": 1,
        "started_at": T0 + timedelta(seconds=1),
        "progress": Progress(current=2, total=4),
        "outcome": {"a": [1]},
        "lease_owner": "n",
    }
    evolved = base.evolve(**changes)
    assert type(evolved) is TaskSnapshot
    assert evolved == dataclasses.replace(base, **changes)
    assert base.status is TaskStatus.QUEUED  # the original is untouched
    assert base.evolve() == base and base.evolve() is not base
    with pytest.raises(dataclasses.FrozenInstanceError):
        evolved.status_version = 4  # type: ignore[misc]


def test_evolve_checks_what_it_changes() -> None:
    base = _snapshot()
    at_two = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    moved = base.evolve(started_at=at_two, ended_at=None, tags=["b", "a"])
    assert moved.started_at == T0 and moved.started_at.tzinfo is UTC
    assert moved.tags == frozenset({"a", "b"}) and isinstance(moved.tags, frozenset)
    with pytest.raises(ValueError, match="started_at must be timezone-aware"):
        base.evolve(started_at=datetime(2026, 3, 1, 12, 0))
    with pytest.raises(TypeError, match="bogus"):
        base.evolve(bogus=1)


def test_a_snapshot_changer_is_evolve_for_its_fields() -> None:
    base = _snapshot()
    changes = {
        "status": TaskStatus.RUNNING,
        "status_version": 3,
        "started_at": T0 + timedelta(seconds=1),
        "outcome": {"a": [1]},
        "tags": ["b", "a"],
    }
    change = snapshot_changer(tuple(changes))
    changed = change(base, *changes.values())
    assert type(changed) is TaskSnapshot
    assert changed == base.evolve(**changes)
    assert isinstance(changed.tags, frozenset) and base.status is TaskStatus.QUEUED
    assert snapshot_changer(tuple(changes)) is change  # made once per set of fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.status_version = 4  # type: ignore[misc]


def test_a_snapshot_changer_checks_what_it_changes() -> None:
    base = _snapshot()
    at_two = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    change = snapshot_changer(("started_at", "ended_at"))
    moved = change(base, at_two, None)
    assert moved.started_at == T0 and moved.started_at.tzinfo is UTC
    assert moved.ended_at is None and moved.created_at is base.created_at
    with pytest.raises(ValueError, match="started_at must be timezone-aware"):
        change(base, datetime(2026, 3, 1, 12, 0), None)
    with pytest.raises(ValueError, match="bogus"):
        snapshot_changer(("status", "bogus"))
    with pytest.raises(ValueError, match="status"):
        snapshot_changer(("status", "status"))


def test_the_trusted_builders_make_the_same_records() -> None:
    snapshot = _snapshot()
    built = trusted_snapshot(
        **{f.name: getattr(snapshot, f.name) for f in dataclasses.fields(snapshot)}
    )
    assert type(built) is TaskSnapshot and built == snapshot
    transition = Transition(
        task_id="t1", version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
    )
    made = trusted_transition(
        task_id="t1",
        version=1,
        from_status=None,
        to_status=TaskStatus.QUEUED,
        at=T0,
        reason=None,
        actor=None,
    )
    assert type(made) is Transition and made == transition and hash(made) == hash(transition)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.version = 2  # type: ignore[misc]


def test_a_submitted_snapshot_is_a_new_task_leased_by_its_owner() -> None:
    lease = T0 + timedelta(seconds=30)
    tags = frozenset({"a", "b"})
    made = submitted_snapshot(
        "t1", "job", TaskStatus.PENDING, T0, tags, 3, "key", "p1", "node-a", lease,
        *(None, 0, None, None, None, None),
    )  # fmt: skip
    with_options = submitted_snapshot(
        "t2", "job", TaskStatus.QUEUED, T0, tags, None, None, None, "node-a", lease,
        T0 + timedelta(minutes=5), 7, "dedupe", 60.0, "per-key", "00-ab-cd-01",
    )  # fmt: skip
    assert (with_options.run_at, with_options.priority, with_options.dedupe_key) == (
        T0 + timedelta(minutes=5),
        7,
        "dedupe",
    )
    assert (with_options.dedupe_window, with_options.concurrency_key) == (60.0, "per-key")
    assert with_options.trace_context == "00-ab-cd-01" and made.trace_context is None
    assert (with_options.started_at, with_options.lease_owner) == (None, "node-a")
    expected = TaskSnapshot(
        task_id="t1",
        name="job",
        status=TaskStatus.PENDING,
        status_version=1,
        attempt=0,
        created_at=T0,
        tags=tags,
        bucket=3,
        bucket_key="key",
        pipeline_run_id="p1",
        owner="node-a",
        lease_owner="node-a",
        lease_until=lease,
    )
    assert type(made) is TaskSnapshot and made == expected
    # Every field not given is the dataclass's default: nothing started, reported, ended.
    given = {"task_id", "name", "status", "status_version", "attempt", "created_at", "tags"}
    given |= {"bucket", "bucket_key", "pipeline_run_id", "owner", "lease_owner", "lease_until"}
    for field in dataclasses.fields(TaskSnapshot):
        if field.name not in given:
            assert getattr(made, field.name) == field.default, field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.status_version = 2  # type: ignore[misc]
