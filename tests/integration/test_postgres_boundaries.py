"""Truth at the boundaries on a real PostgreSQL: ``TEXT`` and ``JSONB`` refuse NUL, and the
driver refuses lone surrogates. Each value is refused where it is handed over; a task
never ends ``succeeded`` in the process while the store stays ``running``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    FailureKind,
    InvalidValue,
    Progress,
    StoreError,
    TaskQuery,
    TaskStatus,
)
from chongming_task.stores.postgres import PostgresTaskStore
from tests.integration.postgres_support import drop_schemas, new_schema, pg_dsn

__all__ = ["pg_dsn"]
S = TaskStatus


@pytest.fixture
def node(pg_dsn: str) -> Iterator[Controller]:
    schema = new_schema()
    store = PostgresTaskStore(pg_dsn, schema=schema)
    store.create_schema()
    controller = Controller(store, activity_interval=0.02)
    yield controller
    controller.close()
    store.close()
    drop_schemas(pg_dsn, [schema])


@pytest.mark.parametrize(
    "result",
    ["report-\x00.csv", {"key\x00": 1}, ["a", {"b": "\x00"}], "report-\udcff.csv"],
    ids=["nul", "nul-key", "nested-nul", "surrogate"],
)
def test_a_result_postgres_cannot_hold_fails_the_task_in_the_process_and_the_store(
    node: Controller, result: Any
) -> None:
    run = node.submit(node.task(lambda token: result, name="returns"))
    final = run.wait(10)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.RESULT_INVALID
    stored = node.get(run.task_id)
    assert stored.status is S.FAILED and stored.failure is not None
    assert stored.failure.kind is FailureKind.RESULT_INVALID
    assert node.held() == [] and node.desynced_tasks == frozenset()


def test_text_with_a_backslash_u0000_is_not_a_nul(node: Controller) -> None:
    run = node.submit(node.task(lambda token: {"path": "C:\\u0000"}, name="literal"))
    assert run.result(10) == {"path": "C:\\u0000"}
    assert node.get(run.task_id).outcome == {"path": "C:\\u0000"}


def test_names_tags_keys_and_reasons_with_nul_are_refused_at_submit(node: Controller) -> None:
    with pytest.raises(InvalidValue, match="NUL"):
        node.submit(node.task(lambda token: None, name="bad\x00name"))
    with pytest.raises(InvalidValue, match="NUL"):
        node.submit(node.task(lambda token: None, name="tagged", tags={"t\x00"}))
    ok = node.task(lambda token: None, name="ok")
    with pytest.raises(InvalidValue, match="NUL"):
        ok.configure(bucket_key="k\x00").submit()
    run = node.submit(ok)
    run.wait(10)
    with pytest.raises(InvalidValue, match="NUL"):
        node.stop(run.task_id, reason="because\x00")
    assert sum(node.stats().values()) == 1


def test_a_nul_progress_message_is_refused_in_the_task_and_the_lease_goes_on(
    node: Controller,
) -> None:
    seen: list[str] = []

    @node.task(name="progress")
    def progress(token: CancellationToken) -> str:
        try:
            token.checkpoint(Progress(current=1, message="50%\x00"))
        except InvalidValue as exc:
            seen.append(str(exc))
        token.checkpoint(Progress(current=2, message="fine"))
        return "done"

    run = node.submit(progress)
    assert run.result(10) == "done" and seen and "NUL" in seen[0]


def test_an_exception_message_with_nul_is_stored_escaped(node: Controller) -> None:
    @node.task(name="raises")
    def raises(token: CancellationToken) -> None:
        raise RuntimeError("bad byte \x00 in \udcff")

    run = node.submit(raises)
    assert run.wait(10).status is S.FAILED
    stored = node.get(run.task_id)
    assert stored.status is S.FAILED and stored.failure is not None
    assert "\\x00" in stored.failure.message and "\\udcff" in stored.failure.message


def test_reads_with_text_postgres_cannot_take_are_store_errors_or_nothing(
    node: Controller,
) -> None:
    store = node.store
    with pytest.raises(StoreError):
        store.get("\udcff")
    # No stored text holds NUL: such a read finds nothing, as any other unknown id.
    assert store.get("a\x00") is None
    assert store.query(TaskQuery(name="a\x00b", tag="\x00")) == []
    with pytest.raises(ValueError):
        store.query(TaskQuery(tag="caf\udce9"))
