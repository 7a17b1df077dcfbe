"""Controls of many tasks at once: ``pause|resume|stop|cancel`` with the selection flags
of ``ps``, from real CLI processes, against a real node process holding the tasks, on
SQLite and on PostgreSQL. Each task gets its own control; ``--dry-run`` sends nothing;
off a terminal a selection of several tasks needs ``--yes``, on one the command asks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import Controller, TaskStatus
from chongming_task.stores import open_store
from chongming_task.stores.capabilities import Capabilities
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn, schema  # noqa: F401 (fixtures)
from tests.integration.test_control_order import Place
from tests.integration.test_control_order import place as place
from tests.integration.test_cross_process import Node

S = TaskStatus


def run(place: Place, *args: str, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", *place.cli, *args],
        capture_output=stdin is None,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=None if stdin is None else subprocess.PIPE,
        stderr=None if stdin is None else subprocess.PIPE,
        text=True,
        timeout=60,
    )


@contextlib.contextmanager
def running_fleet(place: Place) -> Iterator[tuple[Node, Controller]]:
    """A node holding three ``loop`` tasks and one ``aloop``, all running."""
    store = open_store(place.db, schema=place.schema)
    console = Controller(store, owner="console", poll_commands=False)
    node = Node(*place.node, *("--submit", "loop") * 3, "--submit", "aloop", "--poll", "0.02")
    try:
        wait_until(lambda: statuses(console, node.task_ids) == [S.RUNNING] * 4, what="all running")
        yield node, console
    finally:
        node.finish()
        console.close()
        store.close()


@pytest.fixture
def fleet(place: Place) -> Iterator[tuple[Node, Controller]]:
    with running_fleet(place) as running:
        yield running


@pytest.fixture
def on_sqlite(tmp_path: Path) -> Place:
    """The CLI's own behaviour, the same whatever the store: checked once, on SQLite."""
    db = str(tmp_path / "bulk.db")
    return Place(db=db, cli=["--db", db], node=[db])


def statuses(console: Controller, task_ids: list[str]) -> list[S]:
    return [console.get(t).status for t in task_ids]


def test_a_selection_is_listed_refused_then_controlled_task_by_task(
    place: Place, fleet: tuple[Node, Controller]
) -> None:
    node, console = fleet
    loops, (aloop,) = node.task_ids[:3], node.task_ids[3:]

    listed = run(place, "pause", "--name", "loop", "--dry-run")
    assert listed.returncode == 0, listed.stderr
    assert "would pause 3 task(s); nothing sent" in listed.stdout
    assert all(t[:12] in listed.stdout for t in loops) and aloop[:12] not in listed.stdout

    refused = run(place, "pause", "--name", "loop")  # no terminal, no --yes
    assert refused.returncode == 2 and "add --yes" in refused.stderr, refused.stderr
    assert statuses(console, node.task_ids) == [S.RUNNING] * 4  # nothing was sent

    paused = run(place, "--json", "pause", "--name", "loop", "--yes", "--reason", "upgrade")
    assert paused.returncode == 0, paused.stderr
    answer = json.loads(paused.stdout)
    assert answer["selected"] == 3 and answer["outcomes"] == {"request accepted": 3}
    assert sorted(t["task_id"] for t in answer["tasks"]) == sorted(loops)
    wait_until(lambda: statuses(console, loops) == [S.PAUSED] * 3, what="all paused")
    assert console.get(aloop).status is S.RUNNING  # outside the selection
    reasons = {t.reason for t in console.history(loops[0]) if t.to_status is S.PAUSING}
    assert any("upgrade" in (r or "") for r in reasons), reasons

    none = run(place, "stop", "--older-than", "1h", "--yes")
    assert none.returncode == 0 and "no task matches" in none.stdout
    resumed = run(place, "resume", "--status", "paused", "--yes")
    assert resumed.returncode == 0 and "resume 3 task(s): 3 request accepted" in resumed.stdout
    wait_until(lambda: statuses(console, loops) == [S.RUNNING] * 3, what="running again")

    stopped = run(place, "stop", "--name", "*loop", "--yes")
    assert "stop 4 task(s): 4 request accepted" in stopped.stdout, stopped.stdout
    for task_id in node.task_ids:
        assert console.wait_for(task_id, timeout=20).status is S.STOPPED
    # Finished tasks have nothing to control: --all selects none of them.
    again = run(place, "--json", "stop", "--all", "--name", "*loop", "--yes")
    assert json.loads(again.stdout)["selected"] == 0, again.stdout


def test_a_selection_on_a_terminal_asks_first(on_sqlite: Place) -> None:
    with running_fleet(on_sqlite) as (node, console):
        _asked(on_sqlite, node, console)


def _asked(place: Place, node: Node, console: Controller) -> None:
    loops = node.task_ids[:3]
    for answer, sent in (("n\n", False), ("y\n", True)):
        leader, follower = os.openpty()
        try:
            os.write(leader, answer.encode())
            said = run(place, "cancel", "--name", "loop", stdin=follower)
        finally:
            os.close(leader)
            os.close(follower)
        assert "cancel 3 task(s)? [y/N]" in said.stderr
        if not sent:
            assert said.returncode == 1 and "nothing sent" in said.stdout
            assert statuses(console, loops) == [S.RUNNING] * 3
        else:
            assert said.returncode == 0 and "3 request accepted" in said.stdout, said.stdout
            for task_id in loops:
                assert console.wait_for(task_id, timeout=20).status in (S.CANCELLED, S.STOPPED)


def test_an_id_and_a_selection_together_or_neither_is_a_usage_error(on_sqlite: Place) -> None:
    place = on_sqlite
    open_store(place.db).close()
    for args, said in (
        (("stop",), "needs a task id, or a selection"),
        (("stop", "abcdef12", "--name", "x"), "not both (--name)"),
        (("pause", "abcdef12", "--dry-run"), "not both (--dry-run)"),
        (("stop", "--name", "x", "--wait", "5"), "--wait follows one task"),
        (("stop", "--older-than", "soon"), "no duration"),
    ):
        result = run(place, *args)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_one_task_failing_its_control_costs_the_others_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store refuses one task's control (here: a fault injected into that one send);
    the others still get theirs, and the answer names the one that failed."""
    from datetime import UTC, datetime

    from chongming_task import TaskSnapshot
    from chongming_task.cli import main
    from chongming_task.control import StoreControl
    from chongming_task.errors import StoreError

    db = tmp_path / "one-fails.db"
    store = open_store(str(db))
    ids = [f"{n}aaaaaa" + "0" * 25 for n in range(3)]
    for task_id in ids:
        store.create(
            TaskSnapshot(
                task_id=task_id,
                name="job",
                status=S.QUEUED,
                status_version=1,
                created_at=datetime.now(UTC),
            )
        )
    store.close()
    real_send = StoreControl.send

    def send(self: StoreControl, task_id: str, *args: object, **kwargs: object) -> object:
        if task_id == ids[1]:
            raise StoreError("disk I/O error")
        return real_send(self, task_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StoreControl, "send", send)
    code = main(["--db", str(db), "--json", "cancel", "--name", "job", "--yes"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 1
    assert answer["outcomes"] == {"request accepted": 2, "failed": 1}
    failed = [t for t in answer["tasks"] if t["outcome"] == "failed"]
    assert [t["task_id"] for t in failed] == [ids[1]] and "disk I/O" in failed[0]["error"]
    store = open_store(str(db))
    try:
        caps = Capabilities(store)
        pending = [len(caps.commands.pending(t) or []) for t in ids]
        assert pending == [1, 0, 1]  # the two others' commands are in the store
    finally:
        store.close()
