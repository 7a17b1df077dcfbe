"""Controls from other processes, carried out in the order the store received them and
judged after the commands still pending for the task: the operator's last word wins.

The holder is a real node subprocess that polls only when the test asks
(``--poll-on``), so every control below reaches the store before the holder sees any.
The controls come from real CLI processes, or from a console whose clock is wrong.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import Controller, TaskStatus
from chongming_task.control import StoreControl
from chongming_task.model import CommandAction
from chongming_task.stores import open_store
from chongming_task.stores.capabilities import Capabilities
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn, schema  # noqa: F401 (fixtures)
from tests.integration.test_cross_process import Node

S = TaskStatus


@dataclass
class Place:
    """Where the nodes meet: the store's address, the CLI's arguments for it, the node's."""

    db: str
    cli: list[str]
    node: list[str]
    schema: str | None = None


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "sqlite":
        db = str(tmp_path / "shared.db")
        yield Place(db=db, cli=["--db", db], node=[db])
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    name: str = request.getfixturevalue("schema")
    yield Place(
        db=dsn,
        cli=["--db", dsn, "--pg-schema", name],
        node=[dsn, "--schema", name],
        schema=name,
    )


def cli(place: Place, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", *place.cli, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}: {result.stderr}"
    return result.stdout


class Holder:
    """A node holding one looping task, polling commands only on request."""

    def __init__(self, place: Place, tmp_path: Path) -> None:
        self.trigger = tmp_path / "poll-now"
        self.node = Node(
            *place.node, "--owner", "holder", "--poll-on", str(self.trigger), "--submit", "loop"
        )
        (self.task_id,) = self.node.task_ids

    def poll(self) -> int:
        """Have the holder poll once; how many commands it completed."""
        self.trigger.touch()
        while True:
            line = self.node.next_line()
            if "polled" in line:
                return int(line["polled"])


@pytest.fixture
def holder(place: Place, tmp_path: Path) -> Iterator[tuple[Holder, Controller]]:
    store = open_store(place.db, schema=place.schema)
    console = Controller(store, owner="console", poll_commands=False)
    h = Holder(place, tmp_path)
    try:
        wait_until(lambda: console.get(h.task_id).status is S.RUNNING, what="running")
        yield h, console
    finally:
        h.node.finish()
        console.close()
        store.close()


@pytest.mark.parametrize(
    ("first", "then", "ends", "commands"),
    [
        ("pause", "resume", S.RUNNING, 2),
        ("resume", "pause", S.PAUSED, 1),  # the resume of a running task: nothing to do
        ("stop", "resume", S.STOPPED, 2),
        ("pause", "stop", S.STOPPED, 2),
    ],
)
def test_two_quick_controls_from_other_processes_leave_the_last_word(
    place: Place,
    holder: tuple[Holder, Controller],
    first: str,
    then: str,
    ends: S,
    commands: int,
) -> None:
    h, console = holder
    cli(place, first, h.task_id)
    said = cli(place, then, h.task_id)
    if (first, then) == ("pause", "resume"):
        # Not answered from the status the pending pause is about to change.
        assert "after the pending pause" in said, said
    assert h.poll() == commands
    if ends is S.STOPPED:
        assert console.wait_for(h.task_id, timeout=15).status is S.STOPPED
        return
    wait_until(lambda: console.get(h.task_id).status is ends, what=ends.value)
    trail = [t.to_status for t in console.history(h.task_id)]
    assert S.PAUSING in trail, trail  # the pause was carried out, not dropped
    assert h.poll() == 0  # nothing left behind
    assert console.get(h.task_id).status is ends


def test_commands_are_carried_out_in_arrival_order_not_by_the_senders_clocks(
    place: Place, holder: tuple[Holder, Controller]
) -> None:
    h, console = holder
    store = console.store
    StoreControl(store, owner="operator").send(h.task_id, CommandAction.STOP)
    slow = datetime.now(UTC) - timedelta(seconds=60)  # this node's clock is a minute behind
    StoreControl(store, owner="slow-node", now=lambda: slow).send(h.task_id, CommandAction.CANCEL)
    assert h.poll() == 2
    final = console.wait_for(h.task_id, timeout=15)
    assert final.status is S.STOPPED
    ends = [t for t in console.history(h.task_id) if t.to_status in (S.STOPPING, S.CANCELLED)]
    assert [(t.to_status, t.actor) for t in ends] == [(S.STOPPING, "operator")]


def test_a_waited_resume_behind_a_pending_pause_waits_for_both(
    place: Place, holder: tuple[Holder, Controller]
) -> None:
    """``resume --wait`` queued behind a pause returns once the holder has carried out
    both, not at once because the task is still running before the pause."""
    h, console = holder
    cli(place, "pause", h.task_id)
    waited = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", *place.cli, "resume", h.task_id, "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Its resume in the store behind the pause, however long the CLI took to start;
        # nothing carried out yet, so it waits.
        pending = Capabilities(console.store).commands.pending
        wait_until(lambda: len(pending(h.task_id) or []) == 2, timeout=60, what="resume stored")
        assert waited.poll() is None
        assert h.poll() == 2
        out, err = waited.communicate(timeout=60)
        assert waited.returncode == 0, err
        assert "after the pending pause" in out or "now running" in out, out
        assert out.rstrip().endswith("now running"), out
    finally:
        if waited.poll() is None:
            waited.kill()
            waited.communicate()
