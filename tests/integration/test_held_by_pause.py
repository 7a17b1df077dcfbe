"""A pause that lands before a task starts (delayed, or waiting to retry) holds it
``queued``: every process can find it and sees why, on both stores. A node process
holds it; CLI processes find it (``ps --status paused``, ``show``) and resume it in bulk
(``resume --status paused``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import CancellationToken, Controller, InMemoryTaskStore, RetryPolicy
from chongming_task.model import TaskStatus
from chongming_task.stores.capabilities import Capabilities
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn
from tests.integration.test_cross_process import Node
from tests.integration.test_fleet import Where, alarms, started, where

__all__ = ["pg_dsn", "started", "where"]  # the fixtures, found by pytest here

S = TaskStatus


def test_a_paused_delayed_task_is_found_held_and_resumed_in_bulk(
    where: Where, started: list[Node]
) -> None:
    # Room for a CLI to start on a loaded machine before the run time (6 s); the wait
    # below is for the run time itself to pass, read from the store, not a guess.
    node = where.node("--owner", "node-a", "--delay", "6", "--submit", "loop")
    started.append(node)
    (task_id,) = node.task_ids
    paused = where.cli("pause", task_id)
    assert paused.returncode == 0, paused.stderr
    # The holder answers the command; the hold is then in the store for everyone.
    wait_until(
        lambda: [t["task_id"] for t in where.json("ps", "--status", "paused")] == [task_id],
        what="the held task among the paused",
    )
    (row,) = where.json("ps", "--status", "paused")
    assert row["status"] == "queued" and row["held_since"] is not None
    table = where.cli("ps", "--status", "paused").stdout
    assert "queued (held by a pause since" in table
    shown = where.cli("show", task_id).stdout
    assert "by a pause since" in shown and "waits for a resume" in shown
    assert where.json("show", task_id)["held_since"] == row["held_since"]
    run_at = datetime.fromisoformat(where.json("show", task_id)["run_at"])
    wait_until(lambda: datetime.now(UTC) > run_at + timedelta(seconds=0.5), timeout=30)
    # Past its run time: a pause holds it, it does not start.
    assert where.json("show", task_id)["status"] == "queued"
    resumed = where.cli("resume", "--status", "paused", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "1 task(s)" in resumed.stdout
    wait_until(lambda: where.json("show", task_id)["status"] == "running", what="started")
    assert where.json("show", task_id)["held_since"] is None
    assert where.json("ps", "--status", "paused") == []
    assert not alarms(where.json("doctor"), "stale-queued")


@pytest.fixture
def node() -> Iterator[Controller]:
    c = Controller(InMemoryTaskStore(), owner="node-r")
    yield c
    c.close(timeout=5)


def test_a_pause_while_a_task_waits_to_retry_holds_it_where_it_can_be_seen(
    node: Controller,
) -> None:
    tries: list[int] = []

    @node.task(name="flaky", retries=1, backoff=RetryPolicy(retries=1, base_delay=1.0, jitter=0.0))
    def flaky(token: CancellationToken) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("once")
        return "then fine"

    run = node.tasks["flaky"].submit()
    wait_until(lambda: run.status is S.QUEUED and run.snapshot().attempt == 1)
    assert node.pause(run.task_id).outcome.value == "pause-pending"
    caps = Capabilities(node.store)
    assert set(caps.holds()) == {run.task_id}
    time.sleep(1.5)  # past the retry's wait
    assert run.status is S.QUEUED and len(tries) == 1
    node.resume(run.task_id)
    assert caps.holds() == {}
    assert run.result(timeout=10) == "then fine"
