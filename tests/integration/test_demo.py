"""The README's first command: the demo node, controlled from a second terminal."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def test_the_demo_node_runs_and_obeys_a_second_terminal(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    cli = [sys.executable, "-m", "chongming_task", "--db", str(db)]
    node = subprocess.Popen(
        [*cli, "demo", "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        task_id = None
        while task_id is None and time.monotonic() < deadline:
            ps = subprocess.run([*cli, "ps"], capture_output=True, text=True, check=False)
            running = [  # a long ingest: the flaky task may sit in retry backoff (queued)
                line.split()[0]
                for line in ps.stdout.splitlines()
                if " ingest " in line and " running " in line
            ]
            task_id = running[0] if running else None
            time.sleep(0.2)
        assert task_id, "no running task appeared"
        out = subprocess.run(
            [*cli, "stop", task_id, "--wait", "10"], capture_output=True, text=True, check=True
        )
        assert "request accepted" in out.stdout and out.stdout.rstrip().endswith("now stopped")
    finally:
        node.terminate()
        output, _ = node.communicate(timeout=30)
    assert node.returncode == 0, output
    assert "stopped by Ctrl-C" in output
    assert "Traceback" not in output
