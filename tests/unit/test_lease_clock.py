"""Lease time on a store with a clock of its own: read at most once a minute, run on by
the node's monotonic clock in between, and deaf to steps of the node's wall clock."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import InMemoryTaskStore
from chongming_task.node.leaseclock import RESYNC, LeaseClock
from chongming_task.stores.capabilities import Capabilities

SERVER = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class ClockedStore(InMemoryTaskStore):
    """A memory store that declares a storage clock, counting each reading."""

    def __init__(self) -> None:
        super().__init__()
        self.server_now = SERVER
        self.reads = 0

    def storage_now(self) -> datetime:
        self.reads += 1
        return self.server_now


class NodeClock:
    """A node's wall clock and monotonic clock, moved apart by the test."""

    def __init__(self) -> None:
        self.wall = SERVER - timedelta(minutes=5)  # five minutes slow
        self.mono = 100.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


def test_lease_time_is_the_stores_clock_read_once_a_minute() -> None:
    store, node = ClockedStore(), NodeClock()
    leases = LeaseClock(Capabilities(store), node.now, node.monotonic)
    assert leases.now() == SERVER and store.reads == 1  # read on first use
    node.advance(10)
    store.server_now += timedelta(seconds=10)
    leases.sync()  # a fresh reading is at hand: not read again
    assert store.reads == 1 and leases.now() == SERVER + timedelta(seconds=10)
    assert leases.offset == timedelta(minutes=5)
    node.advance(RESYNC)
    store.server_now += timedelta(seconds=RESYNC + 0.25)  # the server ran a little fast
    leases.sync()
    assert store.reads == 2
    assert leases.now() == store.server_now  # corrected at the reading
    leases.sync(force=True)
    assert store.reads == 3


def test_a_stepped_wall_clock_leaves_lease_time_alone(caplog: pytest.LogCaptureFixture) -> None:
    store, node = ClockedStore(), NodeClock()
    leases = LeaseClock(Capabilities(store), node.now, node.monotonic)
    leases.sync()
    node.wall += timedelta(hours=1)  # someone set the node's clock an hour ahead
    node.mono += 5
    assert leases.now() == SERVER + timedelta(seconds=5)
    assert leases.offset == timedelta(minutes=5, seconds=5) - timedelta(hours=1)
    with caplog.at_level(logging.WARNING, "chongming_task.leases"):
        leases.sync(force=True)
    assert "clock moved 3600.000s" in caplog.text


def test_without_a_store_clock_lease_time_is_the_nodes() -> None:
    node = NodeClock()
    leases = LeaseClock(Capabilities(InMemoryTaskStore()), node.now, node.monotonic)
    leases.sync()
    assert leases.now() == node.wall and leases.offset == timedelta(0)
