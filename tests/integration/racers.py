"""Racing processes for the race tests (dedupe keys, schedule slots): each racer is a
module run with its own arguments that prints ``ready``, waits for the file ``go`` in
the race's folder, does its part and prints one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import Lines

ROOT = Path(__file__).resolve().parents[2]


def race(
    module: str,
    argvs: list[list[str]],
    folder: Path,
    *,
    answered: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One racer a list of arguments, all told to go at once (each ready first); what
    each printed. ``answered`` is called once every racer has answered, before they are
    waited for (the dedupe race's task runs until then)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        lines = [Lines(proc.stdout) for proc in procs]  # type: ignore[arg-type]
        for said in lines:
            said.wait_for(lambda text: "ready\n" in text, timeout=120, what="a racer ready")
        (folder / "go").touch()
        for said in lines:
            said.wait_for(lambda text: "{" in text, timeout=120, what="a racer's answer")
        got = [
            json.loads(next(line for line in said.text().splitlines() if line.startswith("{")))
            for said in lines
        ]
        if answered is not None:
            answered()
        for proc, said in zip(procs, lines, strict=True):
            proc.wait(120)
            said.close()
            assert proc.returncode == 0, proc.stderr.read()  # type: ignore[union-attr]
        return got
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
