"""Processes that do one thing at the same moment (nodes started together).

Each child runs ``SETUP + BARRIER + ACT`` as ``python -c``: it imports and prepares,
says so, then waits for a start time the parent sends once every child is ready and
spins until it. The children race on what they do, not on interpreter start-up (a
line written to each pipe in turn would wake them one by one).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

BARRIER = """
import sys as _sys, time as _time
print("ready", flush=True)
_start = float(_sys.stdin.readline())
while _time.time() < _start:
    pass
"""


def run_together(
    script: str, argvs: Sequence[Sequence[str]], *, lead: float = 0.2
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``script`` (which holds ``BARRIER``) once per argument list; each child
    passes the barrier ``lead`` seconds after the last is ready. Returns each child's
    exit code and output, in order."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    for child in children:
        assert child.stdout is not None
        said = child.stdout.readline()
        assert said == "ready\n", f"a child said {said!r} instead of ready"
    start = time.time() + lead
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{start}\n")
        child.stdin.flush()
    done = []
    for child in children:
        out, err = child.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(child.args, child.returncode, out, err))
    return done
