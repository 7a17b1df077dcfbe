"""The README's first command: the demo node, controlled from a second process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def test_the_demo_node_runs_and_obeys_a_second_terminal(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    demo = [sys.executable, "-m", "chongming_task.demo", "--db", str(db)]
    node = subprocess.Popen(
        [*demo, "--duration", "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 20
        task_id = None
        while task_id is None and time.monotonic() < deadline:
            ps = subprocess.run([*demo, "ps"], capture_output=True, text=True, check=False)
            running = [  # a long ingest: the flaky task may sit in retry backoff (queued)
                line.split()[0]
                for line in ps.stdout.splitlines()
                if " ingest " in line and " running " in line
            ]
            task_id = running[0] if running else None
            time.sleep(0.2)
        assert task_id, "no running task appeared"
        out = subprocess.run([*demo, "stop", task_id], capture_output=True, text=True, check=True)
        assert "request accepted" in out.stdout
        while time.monotonic() < deadline:
            ps = subprocess.run([*demo, "ps"], capture_output=True, text=True, check=True)
            line = next(x for x in ps.stdout.splitlines() if x.startswith(task_id))
            if " stopped " in line:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"task {task_id} was not stopped: {line}")
        bad = subprocess.run([*demo, "stop", "nope"], capture_output=True, text=True, check=False)
        assert bad.returncode == 1 and "error: no task nope" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        node.terminate()
        output, _ = node.communicate(timeout=30)
    assert node.returncode == 0, output
    assert "stopped by Ctrl-C" in output
