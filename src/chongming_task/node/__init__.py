"""A node: the ``Controller`` and the services it composes (submission, dispatch,
workers, the registry of held runs, supervision, the command poller, the beacon and the
lease clock). A node runs the tasks it defines and controls any task through the store."""

from __future__ import annotations

from .controller import Controller as Controller

__all__ = ["Controller"]
