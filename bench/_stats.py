"""Shared helpers for the benchmark commands."""

from __future__ import annotations

import gc
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

R = TypeVar("R")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def latency_row(name: str, seconds: list[float], width: int = 40) -> str:
    ms = [v * 1000 for v in seconds]
    return f"{name:{width}} {statistics.median(ms):8.2f} {percentile(ms, 99):8.2f} {max(ms):8.2f}"


def in_rounds(contenders: Mapping[str, Callable[[], R]], rounds: int) -> dict[str, list[R]]:
    """Each contender's results, one per round; each round runs every contender once, the
    order turning from round to round. Rounds, not one contender's runs back to back:
    this VM drifts by tens of per cent over minutes, and a ratio is only fair between
    runs made side by side. Each run starts from a collected heap: what the one before
    it left for the cyclic garbage collector (a closed controller's store, say) is not
    walked again on the next contender's time."""
    names = list(contenders)
    results: dict[str, list[R]] = {name: [] for name in names}
    for k in range(rounds):
        turn = k % len(names)
        for name in names[turn:] + names[:turn]:
            gc.collect()
            results[name].append(contenders[name]())
    return results


def callgrind_instructions(script: str, args: list[str], out: Path) -> int:
    """Run ``script`` with ``args`` in this interpreter under ``valgrind --tool=callgrind``
    (its output file ``out``) and return the instructions it counted, every thread."""
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        script,
        *args,
    ]
    subprocess.run(command, check=True, capture_output=True)
    found = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
    assert found, f"no totals in {out}"
    return int(found[1])
