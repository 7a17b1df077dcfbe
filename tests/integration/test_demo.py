"""The README's first command: the demo node runs until Ctrl-C, and every command its
banner prints works pasted into a second terminal, from another directory."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import wait_until


def _paste(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line.split("#")[0])
    return subprocess.run(words, capture_output=True, text=True, cwd=cwd, timeout=60)


def _start_demo(cwd: Path) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """``chongming-task --db demo.db demo`` in ``cwd`` (a relative ``--db``), its output
    lines collected as they come by the thread returned."""
    node = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", "demo.db", "demo"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert node.stdout is not None
        for line in node.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return node, lines, reader


def test_the_demo_runs_until_ctrl_c_and_its_banner_commands_work(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    node, lines, reader = _start_demo(home)
    try:
        wait_until(lambda: any(line.startswith("Ids:") for line in lines), 30, "the banner")
        pasted = [line.strip() for line in lines if line.startswith("  ")]
        db = str(home / "demo.db")
        assert all(db in line for line in pasted), pasted  # absolute: works from anywhere
        by_verb = {shlex.split(line.split("#")[0])[-1]: line for line in pasted}
        assert {"watch", "ps", "schedules", "nodes"} <= set(by_verb), pasted

        ps = _paste(by_verb["ps"], elsewhere)
        assert ps.returncode == 0 and "ingest" in ps.stdout, ps.stderr

        def verb(name: str) -> str:
            return next(line for line in pasted if shlex.split(line)[len(_prefix(line))] == name)

        pause = _paste(verb("pause"), elsewhere)
        assert pause.returncode == 0 and pause.stdout.rstrip().endswith("now paused"), pause
        resume = _paste(verb("resume"), elsewhere)
        assert resume.returncode == 0 and resume.stdout.rstrip().endswith("now running"), resume
        found = _paste(next(line for line in pasted if "--name listen" in line), elsewhere)
        assert "listen" in found.stdout and "running" in found.stdout, found
        many = _paste(next(line for line in pasted if "--name ingest" in line), elsewhere)
        assert many.returncode == 0, many
        assert "pause 2 task(s): 2 request accepted" in many.stdout, many.stdout
        stop = _paste(verb("stop"), elsewhere)
        assert stop.returncode == 0 and stop.stdout.rstrip().endswith("now stopped"), stop

        show = verb("show")
        wait_until(lambda: "Traceback" in _paste(show, elsewhere).stdout, 20, "parse to fail")
        shown = _paste(show, elsewhere).stdout
        assert "KeyError: 'customer_id'" in shown and "failed" in shown

        wait_until(
            lambda: "retry" in _paste(verb("history"), elsewhere).stdout, 30, "flaky to retry"
        )
        pipeline = _paste(next(line for line in pasted if "--pipeline" in line), elsewhere)
        assert pipeline.returncode == 0 and "etl.extract" in pipeline.stdout, pipeline
        schedules = _paste(by_verb["schedules"], elsewhere)
        assert "heartbeat" in schedules.stdout and "every 10s" in schedules.stdout, schedules
        nodes = _paste(by_verb["nodes"], elsewhere)
        assert "live" in nodes.stdout, nodes
        watch = _paste(by_verb["watch"] + " --count 1", elsewhere)
        assert watch.returncode == 0 and watch.stdout.startswith("watching "), watch
        time.sleep(1)
        assert node.poll() is None, "the demo ended by itself"
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=30)
        reader.join(timeout=10)
    output = "\n".join(lines)
    assert node.returncode == 0, output
    assert "stopped by Ctrl-C" in output
    assert "Traceback" not in output


def _prefix(line: str) -> list[str]:
    """The words before the subcommand: the program and ``--db PATH``."""
    words = shlex.split(line.split("#")[0])
    return words[: words.index("--db") + 2]


def test_the_demo_stops_on_a_burst_of_signals(tmp_path: Path) -> None:
    """Ctrl-C pressed twice, or SIGTERM sent to a process group by ``timeout`` and again
    by ``uv run`` forwarding it: signals arrive while the handler of the first still
    runs. A handler that took a lock (``Event.set``) deadlocked against itself there."""
    node, lines, reader = _start_demo(tmp_path)
    try:
        wait_until(lambda: any(line.startswith("Ids:") for line in lines), 30, "the banner")
        for n in range(400):  # SIGTERM and SIGINT back to back, as fast as they go
            node.send_signal(signal.SIGTERM if n % 2 else signal.SIGINT)
        node.wait(timeout=30)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        reader.join(timeout=10)
    output = "\n".join(lines)
    assert node.returncode == 0, output
    assert "stopped by " in output and "Traceback" not in output, output
