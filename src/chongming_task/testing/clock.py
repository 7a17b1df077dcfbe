"""``FakeClock``: time that moves only when a test says so."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from ..model import utc

__all__ = ["FakeClock"]


class FakeClock:
    """A ``Clock`` whose wall time and monotonic reading advance together on ``advance``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = utc(start) if start else datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (forward only: monotonic time never goes back)."""
        with self._lock:
            delta = (utc(when) - self._now).total_seconds()
            if delta < 0:
                raise ValueError("FakeClock.set cannot move time backwards")
            self._now = utc(when)
            self._mono += delta
