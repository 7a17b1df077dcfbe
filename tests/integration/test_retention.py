"""Retention by age: ``prune --older-than`` from real CLI processes on SQLite and
PostgreSQL (with ``--status``, ``--dry-run``, and on SQLite ``--compact`` giving the
space back), and a node's ``retention`` deleting its own buckets' finished tasks in
the background, never an unfinished one or another node's; finished commands by age
with them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import Controller, TaskSnapshot, TaskStatus
from chongming_task.errors import ConfigurationError
from chongming_task.model import Command, Transition
from chongming_task.model import CommandAction as CA
from chongming_task.stores import open_store
from chongming_task.stores.capabilities import Capabilities
from chongming_task.stores.protocol import TaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn, schema  # noqa: F401 (fixtures)
from tests.integration.test_control_order import Place
from tests.integration.test_control_order import place as place

S = TaskStatus
NOW = datetime.now(UTC)


def fill(store: TaskStore, rows: list[tuple[str, S, float, int | None]]) -> None:
    """Tasks by id, status, days since they ended (created an hour before), bucket."""
    items = []
    for task_id, status, days, bucket in rows:
        ended = NOW - timedelta(days=days)
        finished = status in (S.SUCCEEDED, S.FAILED, S.STOPPED, S.CANCELLED, S.LOST)
        snapshot = TaskSnapshot(
            task_id=task_id,
            name="job",
            status=status,
            status_version=1,
            created_at=ended - timedelta(hours=1),
            ended_at=ended if finished else None,
            bucket=bucket,
        )
        made = Transition(task_id=task_id, version=1, from_status=None, to_status=status, at=ended)
        items.append((snapshot, made))
    Capabilities(store).create_many(items)


def cli(place: Place, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", *place.cli, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ids(place: Place) -> list[str]:
    store = open_store(place.db, schema=place.schema)
    try:
        return sorted(s.task_id for s in store.query())
    finally:
        store.close()


@pytest.fixture
def filled(place: Place) -> Iterator[Place]:
    store = open_store(place.db, schema=place.schema)
    rows: list[tuple[str, S, float, int | None]] = [
        (f"old-ok-{n}", S.SUCCEEDED, 10 + n / 100, 1) for n in range(1500)
    ]  # enough rows that deleting them frees whole pages
    rows += [("old-failed", S.FAILED, 9, 2), ("old-lost", S.LOST, 30, None)]
    rows += [("new-ok", S.SUCCEEDED, 1, 1), ("old-running", S.RUNNING, 40, 1)]
    fill(store, rows)
    commands(store, {"old-cmd": 10, "new-cmd": 1, "open-cmd": None})
    store.close()
    yield place


def commands(store: TaskStore, finished: dict[str, float | None]) -> None:
    """Commands by id, days since they finished (``None``: still open)."""
    for command_id, days in finished.items():
        created = NOW - timedelta(days=days or 0, hours=1)
        store.submit_command(
            Command(command_id=command_id, task_id="t", action=CA.STOP, created_at=created)
        )
        if days is not None:
            store.complete_command(command_id, now=NOW - timedelta(days=days), outcome="stopping")


def finished_commands(place: Place) -> int:
    store = open_store(place.db, schema=place.schema)
    try:
        later = NOW + timedelta(days=1)
        return Capabilities(store).prune_by_age.count_finished_commands(before=later)
    finally:
        store.close()


def test_prune_older_than_from_the_cli(filled: Place) -> None:
    place = filled
    dry = cli(place, "--json", "prune", "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"dry_run": True, "pruned": 1502, "commands_pruned": 1}
    assert len(ids(place)) == 1504 and finished_commands(place) == 2  # nothing deleted

    failed = cli(place, "prune", "--older-than", "1w", "--status", "failed")
    assert failed.returncode == 0 and "pruned 1 finished task(s)" in failed.stdout
    assert "old-failed" not in ids(place)

    assert finished_commands(place) == 2  # a --status prune leaves commands alone
    rest = cli(place, "--json", "prune", "--older-than", "7d")
    assert json.loads(rest.stdout)["pruned"] == 1501  # in batches
    assert json.loads(rest.stdout)["commands_pruned"] == 1  # old-cmd; open-cmd is open
    assert ids(place) == ["new-ok", "old-running"]  # the recent one, and never unfinished
    assert finished_commands(place) == 1

    if place.schema is None:  # SQLite: the space, said and given back
        assert json.loads(rest.stdout)["free_bytes"] > 0
        compact = cli(place, "--json", "prune", "--older-than", "7d", "--compact")
        said = json.loads(compact.stdout)
        assert said["compacted"] is True and said["freed_bytes"] > 0
        assert Path(place.db).stat().st_size == said["file_bytes"]
    else:
        refused = cli(place, "prune", "--older-than", "7d", "--compact")
        assert refused.returncode == 2 and "autovacuum" in refused.stderr
    bad = cli(place, "prune", "--older-than", "7d", "--status", "running")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_a_node_prunes_its_own_buckets_finished_tasks_in_the_background(
    place: Place,
) -> None:
    store = open_store(place.db, schema=place.schema)
    rows: list[tuple[str, S, float, int | None]] = [
        (f"mine-{n:04d}", S.SUCCEEDED, 8, 1)
        for n in range(1200)  # three batches
    ]
    rows += [
        ("mine-failed", S.FAILED, 8, 2),  # kept: failures are kept 30 days
        ("mine-old-failed", S.FAILED, 31, 2),
        ("mine-recent", S.SUCCEEDED, 1, 1),
        ("mine-running", S.RUNNING, 50, 1),
        ("theirs", S.SUCCEEDED, 50, 40),  # another node's bucket
    ]
    fill(store, rows)
    commands(store, {"cmd-40d": 40, "cmd-10d": 10})  # the longest age kept: 30 days
    node = Controller(
        store,
        owner="retainer",
        owned_buckets=range(0, 32),
        retention={"*": timedelta(days=7), "failed": timedelta(days=30)},
    )
    try:

        def left() -> list[str]:
            return sorted(s.task_id for s in store.query())

        kept = ["mine-failed", "mine-recent", "mine-running", "theirs"]
        wait_until(lambda: left() == kept, timeout=60, what="pruned to what is kept")
        retention = Capabilities(store).prune_by_age
        later = NOW + timedelta(days=1)
        wait_until(lambda: retention.count_finished_commands(before=later) == 1, 30, "cmd-40d")
        assert len(store.history("mine-recent")) == 1 and store.history("mine-0000") == []
    finally:
        node.close()
        store.close()


def test_bad_retention_is_refused_when_the_node_is_made() -> None:
    from chongming_task import InMemoryTaskStore

    for retention, said in (
        ({"running": timedelta(days=1)}, "only finished tasks"),
        ({"done": timedelta(days=1)}, "not a status"),
        ({"*": 7}, "positive timedelta"),
        ({"*": timedelta(0)}, "positive timedelta"),
    ):
        with pytest.raises(ConfigurationError, match=said):
            Controller(InMemoryTaskStore(), retention=retention)  # type: ignore[arg-type]
