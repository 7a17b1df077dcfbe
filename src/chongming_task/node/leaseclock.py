"""The time every lease decision uses (docs/design.md, "Clocks").

A lease is written by one node (``lease_until``) and judged by another (``reconcile``,
``doctor``, a command claim), so both must read one clock. Where the store has a clock of
its own (``SupportsStorageClock``: PostgreSQL's ``now()``), lease time is the store's: a
node's clock that runs five minutes slow then neither gets its live tasks marked lost by
the others, nor, five minutes fast, keeps a dead node's leases alive. Elsewhere (SQLite,
memory: one machine, or a test's injected clock) it is the node's clock, and the store
contract stays deterministic.

The store's time is not fetched per decision: ``sync()`` measures the offset between the
store's clock and the node's (one round trip, halved), the supervisor calls it on every
lease-renewal pass, and ``now()`` is the node's clock plus that offset. Business times
(``created_at``, ``started_at``, heartbeats) stay on the node's clock.
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


class LeaseClock:
    """One node's lease time: its clock plus the measured offset to the store's."""

    def __init__(self, capabilities: Capabilities, node_now: Callable[[], datetime]) -> None:
        self._storage = capabilities.storage_now if capabilities.has_storage_clock else None
        self._node_now = node_now
        self._offset = _ZERO
        self._synced = self._storage is None
        self._lock = threading.Lock()

    @property
    def offset(self) -> timedelta:
        """The store's clock minus the node's, as last measured (measured now if it never
        was; zero while the store cannot be read)."""
        if not self._synced:
            try:
                self.sync()
            except Exception as exc:  # the store is away: the node's clock until it is back
                log.debug("store clock not read (%s); the node's clock for now", exc)
        return self._offset

    def sync(self) -> None:
        """Measure the store's clock against the node's (nothing where the store has no
        clock). Raises what the store raises; the last offset stays in use."""
        if self._storage is None:
            return
        before = self._node_now()
        storage = self._storage()
        after = self._node_now()
        offset = storage - (before + (after - before) / 2)
        with self._lock:
            if self._synced and abs(offset - self._offset) > timedelta(seconds=1):
                log.warning(
                    "this node's clock moved %.3fs against the store's",
                    (offset - self._offset).total_seconds(),
                )
            self._offset = offset
            self._synced = True

    def now(self) -> datetime:
        """Lease time: the store's clock (as last measured) where it has one."""
        offset = self.offset
        return self._node_now() + offset
