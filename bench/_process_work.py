"""The work bench/processes.py runs: functions a worker process imports by name (a
script's own ``__main__`` functions cannot be found so)."""

from __future__ import annotations

from typing import Any


def spin(iterations: int) -> int:
    """Pure-Python CPU work: holds the interpreter lock the whole time."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def burn(token: Any, iterations: int) -> int:
    return spin(iterations)


def noop(token: Any) -> None:
    return None


def plain_noop() -> None:
    return None


def never_checkpoints(token: Any, iterations: int) -> int:
    return spin(iterations)
