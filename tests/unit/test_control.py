"""Controls sent through a store with no node (``StoreControl``): what the CLI and the
dashboard use, and what a node uses for the tasks it does not hold."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from chongming_task import (
    InvalidValue,
    SqliteTaskStore,
    TaskNotFound,
    TaskSnapshot,
    TaskStatus,
    present,
)
from chongming_task.cli import main
from chongming_task.control import StoreControl
from chongming_task.model import CommandAction, ControlOutcome
from chongming_task.node.controller import Controller
from tests.conftest import wait_until
from tests.unit.core_only import core_only

S = TaskStatus


def _task(store: SqliteTaskStore, task_id: str, status: TaskStatus) -> None:
    now = datetime.now(UTC)
    store.create(
        TaskSnapshot(
            task_id=task_id,
            name="far",
            status=status,
            status_version=1,
            created_at=now,
            owner="node-far",
        )
    )


def test_a_control_of_a_task_held_elsewhere_writes_one_command_for_its_holder(
    tmp_path: Path,
) -> None:
    store = SqliteTaskStore(tmp_path / "s.db")
    try:
        _task(store, "running01", S.RUNNING)
        control = StoreControl(store, owner="console")
        receipt = control.send("running01", CommandAction.STOP, "enough")
        assert receipt.accepted and receipt.outcome is ControlOutcome.ACCEPTED
        assert receipt.status is S.RUNNING
        (command,) = store.claim_commands(now=datetime.now(UTC), lease_seconds=30)
        assert command.command_id == receipt.command_id and command.task_id == "running01"
        assert command.action is CommandAction.STOP and command.reason == "enough"
        assert command.issued_by == "console"
    finally:
        store.close()


@pytest.mark.parametrize("wakes", [True, False], ids=["store-wakes-its-nodes", "core-only"])
def test_an_accepted_control_says_when_the_holder_hears_of_it_and_what_it_will_do(
    tmp_path: Path, wakes: bool
) -> None:
    store = SqliteTaskStore(tmp_path / "s.db")
    try:
        _task(store, "running01", S.RUNNING)
        _task(store, "paused001", S.PAUSED)
        through = store if wakes else core_only(store)
        control = StoreControl(through, owner="console")
        stop = control.send("running01", CommandAction.STOP)
        resume = control.send("paused001", CommandAction.RESUME)
        assert stop.woken is resume.woken is wakes
        when = "is woken at once" if wakes else "finds it at its next poll of the store"
        assert present.control_outcome(stop) == (
            f"request accepted (command {stop.command_id}); the node holding the task {when} "
            "and will ask the task to stop at its next checkpoint"
        )
        assert present.control_outcome(resume).endswith(f"{when} and will resume it")
    finally:
        store.close()


@pytest.mark.parametrize(
    ("status", "action", "outcome"),
    [
        (S.SUCCEEDED, CommandAction.STOP, ControlOutcome.ALREADY_TERMINAL),
        (S.STOPPING, CommandAction.CANCEL, ControlOutcome.ALREADY_STOPPING),
        (S.PAUSED, CommandAction.PAUSE, ControlOutcome.ALREADY_PAUSED),
        (S.RUNNING, CommandAction.RESUME, ControlOutcome.NOT_PAUSED),
    ],
)
def test_a_stored_status_that_answers_the_control_writes_nothing(
    tmp_path: Path, status: TaskStatus, action: CommandAction, outcome: ControlOutcome
) -> None:
    store = SqliteTaskStore(tmp_path / "s.db")
    try:
        _task(store, "task0001", status)
        receipt = StoreControl(store, owner="console").send("task0001", action)
        assert receipt.outcome is outcome and not receipt.accepted
        assert store.claim_commands(now=datetime.now(UTC), lease_seconds=30) == []
    finally:
        store.close()


def test_an_unknown_task_or_a_reason_the_store_cannot_hold_writes_nothing(
    tmp_path: Path,
) -> None:
    store = SqliteTaskStore(tmp_path / "s.db")
    try:
        _task(store, "running01", S.RUNNING)
        control = StoreControl(store, owner="console")
        with pytest.raises(TaskNotFound):
            control.send("nosuchtask", CommandAction.STOP)
        with pytest.raises(InvalidValue):
            control.send("running01", CommandAction.STOP, "bad \udc80 text")
        assert store.claim_commands(now=datetime.now(UTC), lease_seconds=30) == []
    finally:
        store.close()


def test_the_cli_sends_a_control_without_building_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    store = SqliteTaskStore(db)
    _task(store, "running01", S.RUNNING)
    store.close()

    def no_node(*args: object, **kwargs: object) -> None:
        raise AssertionError("the CLI built a Controller to send a control")

    monkeypatch.setattr(Controller, "__init__", no_node)
    assert main(["--db", str(db), "pause", "running01"]) == 0  # conftest restores SIGPIPE
    assert "request accepted" in capsys.readouterr().out
    store = SqliteTaskStore(db)
    try:
        (command,) = store.claim_commands(now=datetime.now(UTC), lease_seconds=30)
        assert command.action is CommandAction.PAUSE
        assert (command.issued_by or "").startswith("cli:")
    finally:
        store.close()


def test_a_pause_or_resume_sent_behind_a_pending_command_is_queued_after_it(
    tmp_path: Path,
) -> None:
    store = SqliteTaskStore(tmp_path / "s.db")
    try:
        _task(store, "running01", S.RUNNING)
        control = StoreControl(store, owner="console")
        pause = control.send("running01", CommandAction.PAUSE)
        # The stored status says "running", but the pause before it is still pending.
        resume = control.send("running01", CommandAction.RESUME)
        assert resume.accepted and resume.behind is CommandAction.PAUSE
        claimed = store.claim_commands(now=datetime.now(UTC), lease_seconds=30)
        assert [c.command_id for c in claimed] == [pause.command_id, resume.command_id]
        for command in claimed:
            store.complete_command(command.command_id, now=datetime.now(UTC), outcome="x")
        # Nothing pending any more: the stored status answers again, nothing written.
        again = control.send("running01", CommandAction.RESUME)
        assert again.outcome is ControlOutcome.NOT_PAUSED and not again.accepted
    finally:
        store.close()


def test_a_store_that_cannot_list_pending_commands_gets_every_pause_and_resume(
    tmp_path: Path,
) -> None:
    """Without ``pending_commands`` a control cannot know it is not behind one: it is
    written for the holder to judge, never answered from a status that may be stale."""
    from tests.integration.json_file_store import JsonFileTaskStore

    store = JsonFileTaskStore(tmp_path / "s.json")
    now = datetime.now(UTC)
    store.create(
        TaskSnapshot(
            task_id="running01", name="far", status=S.RUNNING, status_version=1, created_at=now
        )
    )
    receipt = StoreControl(store, owner="console").send("running01", CommandAction.RESUME)
    assert receipt.accepted and receipt.behind is None
    stop = StoreControl(store, owner="console").send("running01", CommandAction.CANCEL)
    assert stop.accepted


def test_a_node_holding_the_task_carries_out_pending_commands_before_its_own_call(
    tmp_path: Path,
) -> None:
    import threading

    from chongming_task import CancellationToken

    # A file where the wake-up folder would go: no wake-ups, so the console's pause stays
    # pending until the test polls (the node's own poll is 30 s away), whatever the load.
    (tmp_path / "s.db-wake").write_text("")
    store = SqliteTaskStore(tmp_path / "s.db")
    node = Controller(store, owner="holder", command_poll_interval=30)
    release = threading.Event()

    @node.task(name="loop")
    def loop(token: CancellationToken) -> None:
        while not release.is_set():
            token.checkpoint()
            token.sleep(0.01)

    try:
        run = node.tasks["loop"].submit()
        node.wait_for(run.task_id, lambda s: s.status is S.RUNNING, timeout=10)
        StoreControl(store, owner="console").send(run.task_id, CommandAction.PAUSE)
        # Sent here after the console's pause: judged after it, so the task runs on.
        receipt = node.resume(run.task_id)
        assert receipt.accepted and receipt.behind is CommandAction.PAUSE
        node.poll_commands_once()
        trail = [t.to_status for t in node.history(run.task_id)]
        assert S.PAUSING in trail
        # Both carried out, in order (pausing, then running again). The store's running
        # may be the one before the pause (the run's writes land behind it) while the
        # resume's completion is still on its way: wait for the commands, then running.
        wait_until(lambda: store.pending_commands(run.task_id) == [], what="none pending")
        node.wait_for(run.task_id, lambda s: s.status is S.RUNNING, timeout=10)
        trail = [t.to_status for t in node.history(run.task_id)]
        # The resume may find the task still pausing, or already paused at a checkpoint
        # (a loaded machine): either way after the pause, and running again at the end.
        since = trail[len(trail) - 1 - trail[::-1].index(S.PAUSING) :]
        assert since in ([S.PAUSING, S.RUNNING], [S.PAUSING, S.PAUSED, S.RUNNING]), trail
    finally:
        release.set()
        node.close()
        store.close()
