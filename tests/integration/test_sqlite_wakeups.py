"""Processes on one SQLite file wake each other when a command is sent: a node that
polls commands only every 30 s still carries out a stop sent from a CLI process at
once. The named pipes live beside the file; a killed node's pipe is removed by the next
sender, and the last node to close removes the directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chongming_task import TaskStatus
from chongming_task.stores.sqlite.wakeups import wake_directory
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")


def test_a_stop_from_another_process_wakes_a_node_that_polls_rarely(tmp_path: Path) -> None:
    db = tmp_path / "woken.db"
    pipes = wake_directory(os.path.realpath(db))
    assert pipes is not None
    node = Node(db, "--poll", "30", "--submit", "loop", "--submit", "loop")
    first, second = node.task_ids
    try:
        wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
        assert len(list(pipes.iterdir())) == 1  # the node's pipe
        sent = time.monotonic()
        stop = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "stop", first],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stop.returncode == 0 and "request accepted" in stop.stdout, stop.stderr
        wait_until(
            lambda: stored_status(db, first) is TaskStatus.STOPPED, timeout=20, what="stopped"
        )
        # Well inside the 30 s poll: only the wake-up explains it.
        assert time.monotonic() - sent < 20
        assert stored_status(db, second) is TaskStatus.RUNNING
    finally:
        node.finish()
    assert not pipes.exists()  # the last subscriber took the directory with it


def test_a_killed_nodes_pipe_is_removed_by_the_next_sender(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    pipes = wake_directory(os.path.realpath(db))
    assert pipes is not None
    dead = Node(db, "--poll", "30", "--submit", "loop")
    live = Node(db, "--poll", "30", "--submit", "loop")
    (stays,) = live.task_ids
    try:
        wait_until(lambda: len(list(pipes.iterdir())) == 2, what="two pipes")
        dead.kill()
        wait_until(lambda: stored_status(db, stays) is TaskStatus.RUNNING, what="running")
        stop = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "stop", stays],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stop.returncode == 0, stop.stderr
        wait_until(
            lambda: stored_status(db, stays) is TaskStatus.STOPPED, timeout=20, what="stopped"
        )
        assert len(list(pipes.iterdir())) == 1  # the killed node's pipe is gone
    finally:
        dead.finish()
        live.finish()


def _pause(db: Path, task_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "pause", task_id],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_symlink_in_the_wake_folder_is_never_written_through(tmp_path: Path) -> None:
    db = tmp_path / "linked.db"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    pipes = wake_directory(os.path.realpath(db))
    assert pipes is not None
    node = Node(db, "--poll", "30", "--submit", "loop")
    (task_id,) = node.task_ids
    try:
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
        (pipes / "planted").symlink_to(victim)
        (pipes / "plain").write_text("a regular file\n")
        paused = _pause(db, task_id)
        assert paused.returncode == 0 and "request accepted" in paused.stdout, paused.stderr
        # The node's own pipe still carried the wake-up.
        wait_until(
            lambda: stored_status(db, task_id) is TaskStatus.PAUSED, timeout=20, what="paused"
        )
        assert victim.read_text() == "precious\n"
        assert (pipes / "plain").read_text() == "a regular file\n"
        assert (pipes / "planted").is_symlink()  # left alone: neither followed nor removed
    finally:
        node.finish()


def test_a_wake_folder_others_may_write_is_refused_and_nodes_poll(tmp_path: Path) -> None:
    db = tmp_path / "open.db"
    pipes = wake_directory(os.path.realpath(db))
    assert pipes is not None
    pipes.mkdir(mode=0o700)
    pipes.chmod(0o777)  # as a careless or hostile user left it
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.mkfifo(pipes / "theirs", 0o666)
    node = Node(db, "--poll", "1", "--submit", "loop")
    (task_id,) = node.task_ids
    try:
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
        assert sorted(p.name for p in pipes.iterdir()) == ["theirs"]  # no pipe of ours
        paused = _pause(db, task_id)
        assert paused.returncode == 0, paused.stderr
        # Carried out by the node's poll (every second here), not by a wake-up.
        wait_until(
            lambda: stored_status(db, task_id) is TaskStatus.PAUSED, timeout=20, what="paused"
        )
    finally:
        node.finish()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs chown (root)")
def test_a_wake_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    from chongming_task.stores.sqlite.wakeups import subscribe, untrusted

    folder = tmp_path / "x.db-wake"
    folder.mkdir(mode=0o700)
    os.chown(folder, 12345, -1)
    assert untrusted(folder) == "another user (uid 12345) owns it"
    assert subscribe(folder, lambda: None, name="test") is None
    assert list(folder.iterdir()) == []


def test_new_database_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    import stat

    from chongming_task import CancellationToken, Controller, SqliteTaskStore

    def noop(token: CancellationToken) -> None:
        return None

    db = tmp_path / "private.db"
    before = os.umask(0o022)
    try:
        with Controller(SqliteTaskStore(db)) as node:
            node.submit(noop).result(timeout=20)
            made = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        os.umask(before)
    assert made["private.db"] == 0o600
    assert made["private.db-wal"] == 0o600 and made["private.db-shm"] == 0o600
    shared = tmp_path / "shared.db"
    SqliteTaskStore(shared).close()
    shared.chmod(0o640)  # an operator's own choice stands
    SqliteTaskStore(shared).close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640
