"""`watch` across processes: every transition, endings included (a task that leaves the
default unfinished filter, and one created and finished between two refreshes), with
names, who and why; a live table redrawn in place on a terminal (a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from chongming_task import CancellationToken, Controller, Progress, SqliteTaskStore, TaskStatus
from tests.conftest import Lines, wait_until


def _watch(db: Path, *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "watch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def slow(token: CancellationToken, steps: int) -> int:
    for n in range(steps):
        token.checkpoint(Progress(current=n, total=steps, message=f"step {n}"))
        token.sleep(0.05)
    return steps


def quick(token: CancellationToken) -> str:
    return "done"


def test_watch_shows_every_transition_with_names_and_endings(tmp_path: Path) -> None:
    db = tmp_path / "watch.db"
    with Controller(SqliteTaskStore(db), owner="node-w") as node:
        node.task(slow, name="slow")
        node.task(quick, name="quick")
        long_run = node.submit(slow, 40)
        wait_until(lambda: long_run.status is TaskStatus.RUNNING, what="running")
        watch = _watch(db, "--interval", "0.2")
        try:
            assert watch.stdout is not None
            header = watch.stdout.readline()
            assert header.startswith(f"watching {db}: 1 unfinished"), header
            printed = Lines(watch.stdout)
            # The first refresh has been read: from here on everything is new to watch.
            time.sleep(0.3)
            short = node.submit(quick)  # created and finished between two refreshes
            assert short.wait(10).status is TaskStatus.SUCCEEDED
            assert long_run.wait(30).status is TaskStatus.SUCCEEDED
            long_id, short_id = long_run.task_id[:12], short.task_id[:12]
            printed.wait_for(
                lambda out: all(
                    f"{task}  {name}  running -> succeeded" in out
                    for task, name in ((long_id, "slow"), (short_id, "quick"))
                ),
                what="both successes on the screen",
            )
        finally:
            watch.terminate()
            _, err = watch.communicate(timeout=20)
        out = printed.close()
    # The header line was read above; progress lines are not transitions.
    lines = [line for line in out.splitlines() if " -> " in line]
    moves = {(line.split("  ")[1], line.split("  ")[2], line.split("  ")[3]) for line in lines}
    assert (long_id, "slow", "running -> succeeded by node-w") in moves, out
    short_moves = {m for (i, _, m) in moves if i == short_id}
    assert {
        "new -> queued (submitted) by node-w",
        "running -> succeeded by node-w",
    } <= short_moves, out
    assert all(line.split("  ")[2] == "quick" for line in lines if short_id in line), (
        "every line names its task"
    )
    assert "Traceback" not in err


LIVE_ARGS = ("--interval", "0.2", "--count", "12")


def _read_pty(fd: int, until: float, *, seen: bytes | None = None) -> bytes:
    """What the terminal shows until the program leaves, ``until`` passes, or (if given)
    ``seen`` has been shown."""
    got = b""
    while time.monotonic() < until and (seen is None or seen not in got):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    return got


def _watch_on_a_terminal(db: Path, columns: int, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``watch`` on a pseudo-terminal ``columns`` wide; its process and the terminal's
    side to read (close it when done)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": "40"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "watch", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    return proc, leader


def test_watch_on_a_terminal_redraws_a_live_table(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    with Controller(SqliteTaskStore(db), owner="node-live") as node:
        run = node.submit(slow, 200)
        wait_until(lambda: run.status is TaskStatus.RUNNING, what="running")
        proc, leader = _watch_on_a_terminal(db, 150, *LIVE_ARGS)
        try:
            # The first table drawn (a fixed sleep lost the race on a slow day: watch
            # started after the pause and only ever saw it paused).
            screen = _read_pty(leader, time.monotonic() + 30, seen=b"TASK ID")
            node.pause(run.task_id)
            screen += _read_pty(leader, time.monotonic() + 15)
            proc.wait(timeout=20)
        finally:
            proc.kill()
            os.close(leader)
            node.stop(run.task_id)
    text = screen.decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert "TASK ID" in text and "PROGRESS" in text and run.task_id[:12] in text
    assert "step " in text  # the progress message in its column
    assert "\x1b[" in text and ("\x1b[1A" in text or "\x1b[2K" in text)  # redrawn in place
    # A transition is printed above the table, named, with who asked.
    assert "running -> pausing (pause requested)" in text, text
    assert text.count("TASK ID") >= 1


def test_watch_says_when_a_delayed_task_runs(tmp_path: Path) -> None:
    db = tmp_path / "delayed.db"
    with Controller(SqliteTaskStore(db), owner="node-d") as node:
        node.task(quick, name="quick")
        run = node.tasks["quick"].configure(delay=300).submit()
        watch = _watch(db, "--interval", "0.2", "--count", "1")
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        (line,) = [x for x in out.splitlines() if run.task_id[:12] in x]
        assert "queued (runs at " in line and "in 4m" in line, line
        node.cancel(run.task_id)


def test_watch_in_80_columns_drops_whole_columns_and_cuts_no_status(tmp_path: Path) -> None:
    import re

    from chongming_task.cli.watch import fitting

    db = tmp_path / "narrow.db"
    with Controller(SqliteTaskStore(db), owner="node-narrow") as node:
        node.task(slow, name="a-task-with-a-rather-long-name.for-its-report")
        run = node.tasks["a-task-with-a-rather-long-name.for-its-report"].submit(400)
        wait_until(lambda: run.status is TaskStatus.RUNNING, what="running")
        proc, leader = _watch_on_a_terminal(db, 80, "--count", "2")
        try:
            screen = _read_pty(leader, time.monotonic() + 30)
            proc.wait(timeout=20)
        finally:
            proc.kill()
            os.close(leader)
            node.stop(run.task_id)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode("utf-8", "replace"))
    assert proc.returncode == 0, text
    rows = [line for line in text.splitlines() if run.task_id[:12] in line]
    assert rows and all("running" in row for row in rows), text  # never "runni…"
    headers = next(line for line in text.splitlines() if "TASK ID" in line)
    assert "MESSAGE" not in headers and "STATUS" in headers  # dropped, not squeezed
    assert all(len(line) <= 80 for line in text.splitlines()), text
    # Every column shown has a header (the percentage had none).
    widths = {"TASK ID": 12, "NAME": 45, "STATUS": 7, "DONE": 4, "HEALTH": 6, "AGE": 3}
    widths |= {"PROGRESS": 20, "MESSAGE": 8}
    assert fitting(widths, 200) == list(widths)
    assert fitting(widths, 80)[:3] == ["TASK ID", "NAME", "STATUS"]
    assert "MESSAGE" not in fitting(widths, 80) and "PROGRESS" not in fitting(widths, 80)
