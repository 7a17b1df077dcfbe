"""A full disk under a SQLite store (a tmpfs of a few MB, filled by another file): the
node logs one line when its store writes start failing, with the cause, counts them
while the disk stays full, logs one line when they succeed again, and says so in its
health meanwhile. No traceback per task per pass."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import CancellationToken, Controller, Progress, SqliteTaskStore
from tests.conftest import wait_until


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs inside the test's directory (root and mount needed: a visible skip
    elsewhere, never in CI)."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must be able to mount a tmpfs for the full-disk test")
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI could not mount a tmpfs: {done.stderr.strip()}")
        pytest.skip(f"could not mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(path: Path) -> None:
    """Write until the disk is full."""
    with path.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_logs_one_line_when_it_starts_and_one_when_it_ends(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteTaskStore(small_disk / "tasks.db")
    c = Controller(store, owner="node-a", lease_ttl=0.9, activity_interval=0.05)
    release = threading.Event()

    @c.task(name="busy")
    def busy(token: CancellationToken, n: int) -> int:
        step = 0
        while not release.is_set():
            step += 1
            token.checkpoint(Progress(current=step, message="x" * 200))
            token.sleep(0.01)
        return n

    filler = small_disk / "filler"
    try:
        with caplog.at_level(logging.DEBUG, logger="chongming_task"):
            runs = [c.tasks["busy"].submit(n) for n in range(4)]
            wait_until(lambda: all(r.status.value == "running" for r in runs))
            _fill(filler)
            wait_until(
                lambda: c.health().store_failing_since is not None,
                timeout=15,
                what="the node to see its writes failing",
            )
            # Let it fail for a while: four tasks, twenty passes a second.
            wait_until(lambda: c.health().store_failures >= 100, timeout=30, what="failures")
            assert "disk is full" in (c.health().store_error or "")
            filler.unlink()
            wait_until(
                lambda: c.health().store_failing_since is None,
                timeout=30,
                what="the node to see its writes succeed again",
            )
            release.set()
            assert sorted(r.result(timeout=15) for r in runs) == [0, 1, 2, 3]
    finally:
        release.set()
        c.close(timeout=5)
        store.close()
    ours = [r for r in caplog.records if r.name.startswith("chongming_task")]
    loud = [r for r in ours if r.levelno >= logging.WARNING]
    started = [r for r in loud if "store writes failing" in r.getMessage()]
    ended = [r for r in loud if "store writes succeed again" in r.getMessage()]
    assert len(started) == 1 and "full" in started[0].getMessage(), [r.getMessage() for r in loud]
    assert len(ended) == 1
    assert [r for r in loud if r.exc_info] == [], "a traceback was logged"
    assert len(loud) <= 4, [r.getMessage() for r in loud]
