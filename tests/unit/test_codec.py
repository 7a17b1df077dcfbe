"""The codec's positional rows: columns in the order the schema's *_COLUMNS name, and
the same values as the row dicts (the stores bind them by position)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from chongming_task.model import TaskStatus, Transition
from chongming_task.stores import codec


def test_transition_values_follow_the_column_order_and_round_trip() -> None:
    at = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    for from_status in (None, TaskStatus.QUEUED):
        t = Transition(
            task_id="t1",
            version=2,
            from_status=from_status,
            to_status=TaskStatus.RUNNING,
            at=at,
            reason="r",
            actor="node-a",
        )
        values = codec.transition_to_values(t)
        row = codec.transition_to_row(t)
        assert list(row) == list(codec.TRANSITION_COLUMNS)
        assert values == [row[c] for c in codec.TRANSITION_COLUMNS]
        assert values[2] == (None if from_status is None else "queued")
        assert values[3] == "running" and type(values[3]) is str  # plain text, not the enum
        assert values[4] == "2026-03-01T12:00:00.123456+00:00"
        assert codec.values_to_transition(values) == t


def test_a_transition_at_another_offset_is_stored_in_utc() -> None:
    at = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    t = Transition(task_id="t1", version=1, from_status=None, to_status=TaskStatus.QUEUED, at=at)
    assert codec.transition_to_values(t)[4] == "2026-03-01T12:00:00.000000+00:00"


def test_every_status_has_its_stored_text() -> None:
    assert {s: codec.STATUS_TEXT[s] for s in TaskStatus} == {s: s.value for s in TaskStatus}


def test_stored_time_text_is_isoformat_to_the_microsecond() -> None:
    """encode_dt formats the fields itself (isoformat is slower): the same text, fixed
    width, across the whole range, so text order stays time order."""
    import random

    rng = random.Random(7)
    first = datetime(1, 1, 1, tzinfo=UTC)
    span = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - first) // timedelta(
        microseconds=1
    )
    four_digits = datetime(1000, 1, 1, tzinfo=UTC)  # the first year without leading zeros
    samples = [first, first + timedelta(microseconds=span), four_digits]
    samples += [four_digits - timedelta(microseconds=1), datetime(2026, 12, 4, 9, 5, 7, 3, UTC)]
    samples += [first + timedelta(microseconds=rng.randrange(span)) for _ in range(2000)]
    texts = [codec.encode_dt(at) for at in samples]
    assert texts == [at.isoformat(timespec="microseconds") for at in samples]
    assert {len(text) for text in texts if text is not None} == {32}
    assert sorted(texts, key=str) == [codec.encode_dt(at) for at in sorted(samples)]


def test_life_values_are_the_life_columns_of_the_row() -> None:
    """The SQL stores' compare-and-set writes ``life_values`` by position: the values of
    ``LIFE_COLUMNS``, the same as the full row's; a create writes ``snapshot_to_values``,
    which decode back to the snapshot (every field set, none left at a default)."""
    from chongming_task.model import Failure, FailureKind, Progress, TaskSnapshot

    at = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    snapshot = TaskSnapshot(
        task_id="t1",
        name="job",
        status=TaskStatus.FAILED,
        status_version=5,
        created_at=at,
        attempt=2,
        started_at=at,
        ended_at=at,
        last_heartbeat_at=at,
        progress=Progress(current=1, total=2, message="m"),
        failure=Failure(kind=FailureKind.EXCEPTION, message="boom"),
        outcome={"k": [1]},
        tags=frozenset({"b", "a"}),
        bucket=3,
        bucket_key="k",
        pipeline_run_id="p1",
        owner="n1",
        lease_owner="n2",
        lease_until=at,
        run_at=at,
        priority=-3,
        dedupe_key="d",
        dedupe_window=1.5,
        concurrency_key="c",
        trace_context="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    row = codec.snapshot_to_row(snapshot)
    assert codec.life_values(snapshot) == [row[c] for c in codec.LIFE_COLUMNS]
    values = codec.snapshot_to_values(snapshot)
    assert codec.values_to_snapshot(values) == snapshot and None not in values
    assert set(codec.LIFE_COLUMNS) < set(codec.TASK_COLUMNS)
