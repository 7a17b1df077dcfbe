"""A node whose task the store has ended without it (reconciled ``lost`` by its buckets'
owner while the node was cut off): no lease renewal or heartbeat lands on the finished
row, and the run is desynced at the first refused renewal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import CancellationToken, Controller, TaskStatus
from chongming_task.model import Failure, FailureKind
from chongming_task.stores import open_store
from chongming_task.stores.capabilities import Capabilities, lost_mark
from chongming_task.stores.protocol import TaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn, schema  # noqa: F401 (fixtures)

S = TaskStatus


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TaskStore, TaskStore]]:
    """Two stores on one place: the node's, and the other process's."""
    if request.param == "sqlite":
        where, name = str(tmp_path / "shared.db"), None
    else:
        where, name = request.getfixturevalue("pg_dsn"), request.getfixturevalue("schema")
    mine, theirs = open_store(where, schema=name), open_store(where, schema=name)
    yield mine, theirs
    mine.close()
    theirs.close()


@pytest.mark.parametrize("task", ["loop", "quiet"])
def test_a_renewal_or_heartbeat_refused_by_a_finished_row_desyncs_the_run_at_once(
    stores: tuple[TaskStore, TaskStore], task: str
) -> None:
    """``loop`` checkpoints (its heartbeat is refused first); ``quiet`` never does, so
    only its lease renewal can find out."""
    mine, theirs = stores
    node = Controller(mine, owner="node-a", lease_ttl=0.6, activity_interval=0.05)
    release = threading.Event()

    @node.task(name="loop")
    def loop(token: CancellationToken) -> str:
        while not release.is_set():
            token.checkpoint()
            token.sleep(0.01)
        return "finished here"

    @node.task(name="quiet")
    def quiet(token: CancellationToken) -> str:
        release.wait()
        return "finished here"

    try:
        run = node.tasks[task].submit()
        wait_until(lambda: (theirs.get(run.task_id) or run.snapshot()).status is S.RUNNING)
        stored = theirs.get(run.task_id)
        assert stored is not None
        # Another process marks it lost (its buckets' owner, reconciling).
        caps = Capabilities(theirs)
        won = caps.mark_lost([lost_mark(stored, caps.now(), "node-b", lambda owner: _verdict())])
        assert won == {run.task_id}
        ended = theirs.get(run.task_id)
        assert ended is not None and ended.status is S.LOST
        wait_until(lambda: run.desynced, timeout=10, what="the refused write desyncs the run")
        assert run.task_id in node.desynced_tasks
        # Nothing lands on the finished row afterwards: neither lease nor heartbeat.
        threading.Event().wait(0.5)
        assert theirs.get(run.task_id) == ended
    finally:
        release.set()
        node.close()


def _verdict() -> tuple[Failure, str]:
    return Failure(kind=FailureKind.LOST, message="lease expired", carrier_may_run=True), "lost"
