"""``CommandChannel``: a store's command capabilities, resolved once, each with its
fallback: how a node is woken for commands, which it claims, what waits behind a task's
pending ones, and the log of finished ones (docs/design.md, "Commands")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ..model import Command
from ._supports import (
    SupportsAddressedWakeups,
    SupportsCommandLog,
    SupportsCommandWakeups,
    SupportsHolderClaim,
    SupportsPendingCommands,
)
from .protocol import TaskStore

__all__ = ["CommandChannel"]


class CommandChannel:
    """The command side of ``Capabilities`` (its ``commands``)."""

    __slots__ = ("_addressed", "_holder_claim", "_log", "_pending", "_store", "_subscribe")

    def __init__(self, store: TaskStore) -> None:
        self._store = store
        self._subscribe = (
            store.subscribe_commands if isinstance(store, SupportsCommandWakeups) else None
        )
        self._addressed = (
            store.subscribe_commands_for if isinstance(store, SupportsAddressedWakeups) else None
        )
        self._holder_claim = (
            store.claim_commands_for if isinstance(store, SupportsHolderClaim) else None
        )
        self._pending = (
            store.pending_commands if isinstance(store, SupportsPendingCommands) else None
        )
        self._log: SupportsCommandLog | None = (
            store if isinstance(store, SupportsCommandLog) else None
        )

    def found(self) -> list[str]:
        """The capabilities the store has, by name (for ``Capabilities``' repr)."""
        return [
            name
            for name, present in (
                ("subscribe_commands", self._subscribe),
                ("addressed wake-ups", self._addressed),
                ("holder claim", self._holder_claim),
                ("pending commands", self._pending),
                ("command log", self._log),
            )
            if present is not None
        ]

    def subscribe(
        self, wake: Callable[[], None], *, holder: str | None = None
    ) -> Callable[[], None] | None:
        """Subscribe ``wake`` to command wake-ups: for ``holder``'s commands only where
        the store addresses them (``SupportsAddressedWakeups``), else for all. ``None``
        where the store has none (the poller's interval alone then bounds the latency)."""
        if holder is not None and self._addressed is not None:
            return self._addressed(holder, wake)
        return self._subscribe(wake) if self._subscribe is not None else None

    def claim(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """The open commands ``holder`` may act on (``SupportsHolderClaim``), else all."""
        if self._holder_claim is not None:
            return self._holder_claim(holder, now=now, lease_seconds=lease_seconds, limit=limit)
        return self._store.claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)

    def pending(self, task_id: str) -> list[Command] | None:
        """The task's unfinished commands in arrival order; ``None`` where the store
        cannot tell (then any control may be behind one: send it as a command)."""
        return None if self._pending is None else self._pending(task_id)

    @property
    def has_log(self) -> bool:
        """Whether the store keeps finished commands (``SupportsCommandLog``)."""
        return self._log is not None

    def finished(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """Commands finished after ``after``; empty where the store keeps no log."""
        return [] if self._log is None else self._log.finished_commands(after=after, limit=limit)
