"""Where time comes from. Everything that reads time takes a ``Clock`` so tests can fake it.

A fake clock for tests lives in ``chongming_task.testing``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import partial
from typing import Protocol, runtime_checkable

__all__ = ["EPOCH", "Clock", "SystemClock"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The Unix epoch, as the aware datetime every record's times are compared with."""


@runtime_checkable
class Clock(Protocol):
    """Wall time (UTC-aware, for records) and a monotonic reading (for durations)."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock. Both readings are the C functions themselves, with no Python frame
    around them: every submit and every transition reads the clock."""

    now = staticmethod(partial(datetime.now, UTC))
    monotonic = staticmethod(time.monotonic)
