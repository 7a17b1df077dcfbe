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
