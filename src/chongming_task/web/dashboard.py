"""``Dashboard``: what the dashboard's pages read and act on: one store, its
capabilities, the settings, the follower that watches the store, and how controls are
sent (through the store: the dashboard is no node)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from datetime import datetime

from ..control import StoreControl
from ..node.controller import Controller
from ..policies import BucketPolicy
from ..stores.capabilities import Capabilities
from ..stores.protocol import TaskStore
from .access import LOOPBACK, Access
from .follow import Follower
from .metrics import store_registry

__all__ = ["Dashboard"]


class Dashboard:
    """What the pages read and act on: one store, its capabilities, the settings."""

    def __init__(
        self,
        store: TaskStore,
        *,
        where: str,
        num_buckets: int | None = None,
        read_only: bool = False,
        token: str | None = None,
        allowed_hosts: Iterable[str] = LOOPBACK,
        aside: TaskStore | None = None,
    ) -> None:
        """``allowed_hosts``: the host names a request may name (``_access``); the
        loopback names by default, so a dashboard made without any answers only there.
        ``num_buckets`` ``None``: the fleet checks judge by the count the live nodes
        declared, and bucket filters by ``DEFAULT_NUM_BUCKETS``."""
        self.store = store
        self.caps = Capabilities(store)
        self.where = where
        self.policy = BucketPolicy() if num_buckets is None else BucketPolicy(num_buckets)
        self.read_only = read_only
        self.access = Access(token=token, allowed_hosts=allowed_hosts)
        """Who may ask: the host named, the origin of a control, the token."""
        self.owner = f"web:{socket.gethostname()}:{os.getpid()}"
        self.control = StoreControl(store, owner=self.owner)
        """Controls sent through the store: the dashboard is no node."""
        self.closing: Callable[[], bool] = lambda: False
        """Whether the server is shutting down (``web`` sets it): open event streams
        then end, so that a stop is not held by a browser tab."""
        self.registry = store_registry(self)
        # The follower's whole-store reads take their own connection where one is given,
        # so a request never queues behind them (SQLite serializes one connection).
        self.follower = Follower(
            Capabilities(aside) if aside is not None else self.caps,
            self.registry,
            num_buckets=num_buckets,
        )

    def controller(self) -> Controller:
        """An operator's node for ``reconcile``: it acts for nodes and never takes their
        commands."""
        return Controller(
            self.store,
            owner=self.owner,
            num_buckets=self.policy.num_buckets,
            poll_commands=False,
        )

    def now(self) -> datetime:
        return self.caps.now()
