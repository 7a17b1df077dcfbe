"""Shared helpers for the benchmark commands."""

from __future__ import annotations

import statistics


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def latency_row(name: str, seconds: list[float], width: int = 40) -> str:
    ms = [v * 1000 for v in seconds]
    return f"{name:{width}} {statistics.median(ms):8.2f} {percentile(ms, 99):8.2f} {max(ms):8.2f}"
