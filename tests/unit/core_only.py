"""A store offering the 14 methods of ``TaskStore`` and nothing else: what the node does
for a role a store does not declare (its fallbacks), tested over the memory store."""

from __future__ import annotations

from typing import Any

from chongming_task.stores.protocol import TaskStore


class CoreOnly:
    """``store``'s core methods, and none of its roles or traits."""

    def __init__(self, store: TaskStore) -> None:
        self.inner = store
        for name in _CORE:
            setattr(self, name, getattr(store, name))

    def __repr__(self) -> str:
        return f"CoreOnly({self.inner!r})"


_CORE = [n for n, v in vars(TaskStore).items() if callable(v) and not n.startswith("_")]


def core_only(store: Any) -> TaskStore:
    """``store`` behind its 14 methods alone."""
    wrapped: TaskStore = CoreOnly(store)  # type: ignore[assignment]
    return wrapped
