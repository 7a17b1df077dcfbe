"""What a runtime thread tells the store about its writes: a hint a store may ignore.

The node's ``Writer`` thread writes runs' transitions behind the workers; nobody is
blocked on one of its writes the way a caller of ``submit`` or ``stop`` is. A store with
group commit may let such a write wait briefly for a caller's write to share a commit
with (``GroupCommit`` in ``_sqlite_group``).
"""

from __future__ import annotations

import threading

__all__ = ["let_writes_wait", "writes_can_wait"]


class _Thread(threading.local):
    # A class default, not getattr(local, name, default): on a thread that never set it
    # that formats an AttributeError on every write (2 us a call, measured).
    can_wait = False


_thread = _Thread()


def let_writes_wait() -> None:
    """The writes this thread makes from now on may wait briefly to share a commit."""
    _thread.can_wait = True


def writes_can_wait() -> bool:
    """Whether this thread's writes may wait (``let_writes_wait``)."""
    return _thread.can_wait
