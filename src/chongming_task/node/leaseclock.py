"""The time every lease decision uses (docs/design.md, "Clocks").

A lease is written by one node (``lease_until``) and judged by another (``reconcile``,
``doctor``, a command claim), so both must read one clock. Where the store has a clock of
its own (``SupportsStorageClock``: PostgreSQL's ``now()``), lease time is the store's: a
node's clock that runs five minutes slow then neither gets its live tasks marked lost by
the others, nor, five minutes fast, keeps a dead node's leases alive. Elsewhere (SQLite,
memory: one machine, or a test's injected clock) it is the node's clock, and the store
contract stays deterministic.

The store's time is not fetched per decision. ``sync()`` reads the store's clock (one
round trip, its midpoint taken) at most once every ``RESYNC`` seconds, and lease time
runs on from that reading by the node's monotonic clock, which never jumps and drifts
from the server's by parts per million (milliseconds a minute). So a node whose wall
clock is stepped keeps writing true leases, and an idle node reads the server's clock
once a minute, not at every pass. Business times (``created_at``, ``started_at``,
heartbeats) stay on the node's wall clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from ..stores.capabilities import Capabilities

__all__ = ["LeaseClock"]

log = logging.getLogger("chongming_task.leases")

_ZERO = timedelta(0)


RESYNC = 60.0
"""Seconds a reading of the store's clock is run on before it is read again."""


class LeaseClock:
    """One node's lease time: the store's clock as last read, run on by the node's
    monotonic clock (the node's own clock where the store has none)."""

    def __init__(
        self,
        capabilities: Capabilities,
        node_now: Callable[[], datetime],
        monotonic: Callable[[], float],
    ) -> None:
        self._storage = capabilities.storage_now if capabilities.has_storage_clock else None
        self._node_now = node_now
        self._monotonic = monotonic
        self._reading: tuple[datetime, float] | None = None  # store time, monotonic then
        self._wall_offset: timedelta | None = None  # store's clock minus the node's, then
        self._lock = threading.Lock()

    @property
    def offset(self) -> timedelta:
        """Lease time minus the node's wall clock, now (zero where the store has no clock,
        or while it cannot be read)."""
        return self.now() - self._node_now() if self._storage is not None else _ZERO

    def sync(self, *, force: bool = False) -> None:
        """Read the store's clock, unless a reading younger than ``RESYNC`` seconds is at
        hand (``force``: read it anyway). Nothing where the store has no clock. Raises
        what the store raises; the last reading stays in use."""
        if self._storage is None:
            return
        reading = self._reading
        if not force and reading is not None and self._monotonic() - reading[1] < RESYNC:
            return
        before = self._monotonic()
        storage = self._storage()
        after = self._monotonic()
        midpoint = before + (after - before) / 2
        wall_offset = storage - self._node_now()
        with self._lock:
            last = self._wall_offset
            if last is not None and abs(wall_offset - last) > timedelta(seconds=1):
                log.warning(
                    "this node's clock moved %.3fs against the store's (leases are not "
                    "affected: they run on the store's clock)",
                    (last - wall_offset).total_seconds(),
                )
            self._wall_offset = wall_offset
            self._reading = (storage, midpoint)

    def now(self) -> datetime:
        """Lease time: the store's clock (as last read, run on) where it has one."""
        if self._storage is None:
            return self._node_now()
        if self._reading is None:
            try:
                self.sync()
            except Exception as exc:  # the store is away: the node's clock until it is back
                log.debug("store clock not read (%s); the node's clock for now", exc)
        reading = self._reading
        if reading is None:
            return self._node_now()
        return reading[0] + timedelta(seconds=self._monotonic() - reading[1])
