"""Every name, key and count has one bound, refused where the user hands it over
(``InvalidValue`` / ``ConfigurationError``), with nothing stored; and the text shown in
a terminal or a DSN shown anywhere carries nothing it should not."""

from __future__ import annotations

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    InvalidValue,
    Pipeline,
    Progress,
)
from chongming_task.control import StoreControl
from chongming_task.errors import ConfigurationError
from chongming_task.limits import (
    LIMITS,
    MAX_BUCKETS,
    MAX_DEDUPE_KEY,
    MAX_OWNER,
    MAX_PROGRESS_MESSAGE,
    MAX_REASON,
    MAX_TAGS,
    MAX_TASK_NAME,
)
from chongming_task.model import CommandAction
from chongming_task.policies import BucketPolicy, parse_buckets
from chongming_task.present import table
from chongming_task.schedules import IntervalTrigger
from chongming_task.stores import open_store
from chongming_task.stores.dsn import check_schema_name, check_target, is_postgres_dsn, shown_dsn


def _noop(token: CancellationToken) -> None:
    return None


def test_the_limits_table_names_each_bound_once() -> None:
    names = [limit.what for limit in LIMITS]
    assert len(names) == len(set(names))
    assert all(limit.value > 0 for limit in LIMITS)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"dedupe_key": "k" * (MAX_DEDUPE_KEY + 1)}, "dedupe_key"),
        ({"concurrency_key": "c" * 501}, "concurrency_key"),
        ({"bucket_key": "b" * 501}, "bucket_key"),
        ({"tags": {"t" * 251}}, "tag"),
        ({"tags": {f"t{i}" for i in range(MAX_TAGS + 1)}}, "tags"),
    ],
)
def test_a_key_past_its_bound_is_refused_at_configure(
    options: dict[str, object], named: str
) -> None:
    with Controller(InMemoryTaskStore()) as node:
        with pytest.raises(InvalidValue, match=named) as raised:
            node.task(_noop).configure(**options)  # type: ignore[arg-type]
        assert "chongming_task.limits" in str(raised.value)
        assert node.store.query() == []


def test_a_key_at_its_bound_is_taken() -> None:
    with Controller(InMemoryTaskStore()) as node:
        run = node.task(_noop).configure(dedupe_key="k" * MAX_DEDUPE_KEY).submit()
        assert run.result(timeout=10) is None


def test_names_reasons_and_owners_past_their_bounds_are_refused() -> None:
    store = InMemoryTaskStore()
    with pytest.raises(InvalidValue, match="owner"):
        Controller(store, owner="N" * (MAX_OWNER + 1))
    with pytest.raises(InvalidValue, match="owner"):
        Controller(store, owner="ü" * 4001)
    with pytest.raises(InvalidValue, match="owner"):
        StoreControl(store, owner="N" * 9000)
    with Controller(store) as node:
        with pytest.raises(InvalidValue, match="task name"):
            node.task(_noop, name="n" * (MAX_TASK_NAME + 1))
        with pytest.raises(InvalidValue, match="bucket_key"):
            node.task(_noop).configure(bucket_key="b" * 501).submit()
        with pytest.raises(InvalidValue, match="schedule name"):
            node.schedule("s" * 201, _noop, IntervalTrigger(60))
        pipeline = Pipeline("p" * 201)
        pipeline.add("a", _noop)
        with pytest.raises(InvalidValue, match="pipeline name"):
            node.submit_pipeline(pipeline)
        assert store.query() == []
        run = node.submit(_noop)
        run.result(timeout=10)
        with pytest.raises(InvalidValue, match="reason"):
            node.stop(run.task_id, reason="r" * (MAX_REASON + 1))
        with pytest.raises(InvalidValue, match="reason"):
            StoreControl(store, owner="cli").send(
                run.task_id, CommandAction.STOP, "r" * (MAX_REASON + 1)
            )


def test_a_progress_message_past_its_bound_fails_the_checkpoint_not_the_store() -> None:
    def chatty(token: CancellationToken) -> None:
        token.checkpoint(Progress(current=1, message="m" * (MAX_PROGRESS_MESSAGE + 1)))

    with Controller(InMemoryTaskStore()) as node:
        run = node.submit(chatty)
        run.wait(timeout=10)
        assert run.snapshot().failure is not None
        assert "progress.message" in run.snapshot().failure.message


def test_bucket_counts_and_ranges_are_bounded_before_anything_is_built() -> None:
    with pytest.raises(ConfigurationError, match="65,536"):
        BucketPolicy(MAX_BUCKETS + 1)
    assert BucketPolicy(MAX_BUCKETS).num_buckets == MAX_BUCKETS
    with pytest.raises(ConfigurationError, match="out of range"):
        parse_buckets("0-99999999999", 64)  # refused without building the range
    with pytest.raises(ConfigurationError):
        parse_buckets("0-" + "9" * 5000, 64)
    with pytest.raises(ConfigurationError):
        Controller(InMemoryTaskStore(), num_buckets=10**11)


@pytest.mark.parametrize(
    "schema",
    ["sec2\n", "information_schema", "pg_catalog", "pg_anything", "Upper", "a-b", "x" * 41, ""],
)
def test_a_schema_name_must_match_in_full_and_not_be_postgres_own(schema: str) -> None:
    with pytest.raises(ConfigurationError):
        check_schema_name(schema)


def test_a_schema_name_of_our_own_passes() -> None:
    assert check_schema_name("chongming") == "chongming"
    assert check_schema_name("x" * 40) == "x" * 40


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/db?password=sekrit",
            "postgresql://postgres@127.0.0.1:5432/db",
        ),
        ("postgresql://app:sekrit@db:5432/ops", "postgresql://app@db:5432/ops"),
        ("host=127.0.0.1 password=sekrit dbname=ops user=app", "postgresql://app@127.0.0.1/ops"),
        ("host=h password='se kr\\'it' dbname=d", "postgresql://h/d"),
        ("postgres://u:p@[::1]:5433/z", "postgresql://u@[::1]:5433/z"),
    ],
)
def test_every_dsn_form_is_shown_without_its_password(dsn: str, shown: str) -> None:
    assert is_postgres_dsn(dsn)
    assert shown_dsn(dsn) == shown
    assert "sekrit" not in shown_dsn(dsn) and "kr" not in shown_dsn(dsn)


def test_a_password_with_an_at_sign_shows_no_part_of_it() -> None:
    # libpq ends the user part at the first "@": the rest is read as the host.
    shown = shown_dsn("postgresql://user:se@cret@host/db")
    assert "cret" not in shown and "se@" not in shown
    assert shown.endswith("@host/db")


def test_other_schemes_are_refused_by_name_and_paths_are_sqlite() -> None:
    with pytest.raises(ConfigurationError, match="unsupported scheme mysql"):
        check_target("mysql://x@y/z")
    with pytest.raises(ConfigurationError, match="unsupported scheme mysql"):
        open_store("mysql://x@y/z")
    for path in ("tasks.db", "a=b.db", "./host=x.db", ":memory:"):
        assert not is_postgres_dsn(path)


def test_a_table_shows_control_characters_escaped() -> None:
    shown = table(["NAME"], [["\x1b[31mRED\x1b]0;pwned\x07"], ["two\nlines"], ["ok"]])
    assert "\x1b" not in shown and "\x07" not in shown
    assert "\\x1b[31mRED" in shown
    assert len(shown.splitlines()) == 4  # the header and three rows: no row split


def test_the_security_page_prints_the_limits_table_as_it_is() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "security.md").read_text("utf-8")
    for limit in LIMITS:
        row = f"| {limit.what} | {limit.value:,} {limit.unit}".rstrip() + " | " + limit.why + " |"
        assert row in page, row
