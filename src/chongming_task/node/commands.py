"""Control across processes, the node's side: ``ControlRouter`` sends a control call
to the run this process holds or, for any other task, through the store
(``control.StoreControl``); ``CommandPoller`` is the holder's side: claim, then act on a
run held here, or release.

The poller claims open commands under a lease; a command for a run held here is carried
out and completed with its outcome; a command for a task held elsewhere is *released*,
never completed (the holder would never hear of it: docs/design.md, "Commands"); a
command for a task that is gone or already terminal is completed as such.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..control import StoreControl
from ..errors import StoreUnavailable
from ..limits import MAX_REASON
from ..model import CommandAction, ControlOutcome, ControlReceipt
from ..run.life import Run
from ..values import check_text
from .services import LoopService, NodeContext, Pass

__all__ = ["CommandPoller", "ControlRouter", "act"]

log = logging.getLogger("chongming_task.commands")


def act(run: Run, action: CommandAction, reason: str | None, actor: str | None) -> ControlOutcome:
    """Carry out ``action`` on a run this process holds."""
    if action is CommandAction.STOP:
        return run.stop(reason, actor)
    if action is CommandAction.PAUSE:
        return run.pause(reason, actor)
    if action is CommandAction.RESUME:
        return run.resume(reason, actor)
    return run.cancel(reason, actor)


POLL_WITHOUT_WAKEUPS = 0.5
"""Seconds between two command polls where the store pushes no wake-up: the latency of
a control sent from another process."""
POLL_WITH_WAKEUPS = 10.0
"""Seconds between two command polls where the store wakes the poller (Postgres's
``LISTEN``, SQLite's named pipes): the poll is then only the safety net for a lost
wake-up, and an idle node's polls cost Postgres 0.1 transaction a second, not 2."""
POLL_WITH_PULSE = 60.0
"""... and where the node's beacon also looks at the queue every third of a lease TTL
(``FleetRegistry``): that is the safety net, and the poll's own pass a last one."""


class CommandPoller(LoopService):
    """Polls every ``interval`` seconds, sooner when the store pushes a wake-up or the
    beacon finds commands waiting. ``interval=None``: once the store takes the
    subscription, ``POLL_WITH_PULSE`` or ``POLL_WITH_WAKEUPS``; else
    ``POLL_WITHOUT_WAKEUPS``."""

    def __init__(self, node: NodeContext, *, lease: float, interval: float | None) -> None:
        super().__init__()
        self.name = f"chongming-commands[{node.owner}]"
        self._given = interval
        self.interval = POLL_WITHOUT_WAKEUPS if interval is None else interval
        self._owner = node.owner
        self._registry = node.registry
        self._caps = node.capabilities
        self._store = node.capabilities.store
        self._leases = node.leases
        self._lease = lease
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        if self.started:
            return
        super().start()
        # Stores that can push a wake-up (Postgres LISTEN/NOTIFY) shorten the wait; the
        # poll interval still bounds it when a notification is lost.
        self._unsubscribe = self._caps.commands.subscribe(self.wake, holder=self._owner)
        if self._given is None and self._unsubscribe is not None:
            self.interval = POLL_WITH_PULSE if self._caps.has_fleet_registry else POLL_WITH_WAKEUPS

    def stop(self) -> None:
        super().stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def run_once(self, now: float | None = None) -> Pass:
        # Leases on commands are wall-clock times: the pass reads the node's clock.
        try:
            return Pass(done=self.poll_once())
        except StoreUnavailable as exc:
            log.debug("command poll: %s", exc)  # the supervisor reports the outage
            return Pass()

    def poll_once(self) -> int:
        """Claim open commands and act on those for runs held here. Returns how many
        commands were completed here."""
        store = self._store
        commands = self._caps.commands.claim(
            self._owner, now=self._leases.now(), lease_seconds=self._lease
        )
        completed = 0
        for command in commands:
            run = self._registry.get(command.task_id)
            if run is not None:
                outcome = act(run, command.action, command.reason, command.issued_by)
            else:
                stored = store.get(command.task_id)
                if stored is None:
                    outcome = ControlOutcome.UNKNOWN_TASK
                elif stored.is_terminal:
                    outcome = ControlOutcome.ALREADY_TERMINAL
                else:
                    store.release_command(command.command_id, now=self._leases.now())
                    continue
            store.complete_command(
                command.command_id, now=self._leases.now(), outcome=outcome.value
            )
            completed += 1
        return completed


class ControlRouter:
    """Where a control call goes: to the run when this process holds it, else through
    the store (``StoreControl``: answered from the stored status, or a command for the
    holder's poller, "request accepted")."""

    def __init__(self, node: NodeContext) -> None:
        self._owner = node.owner
        self._registry = node.registry
        self._caps = node.capabilities
        self._rules = node.capabilities.value_rules
        self.store = StoreControl(node.capabilities.store, owner=node.owner, now=node.now)
        """Controls of the tasks this process does not hold."""
        self.wake: Callable[[], None] | None = None
        """Wakes this node's command poller; ``None`` in a node that never polls (a
        control of a run held here is then always carried out at once)."""

    def route(self, task_id: str, action: CommandAction, reason: str | None) -> ControlReceipt:
        check_text(task_id, "task id", self._rules)
        if reason is not None:
            check_text(reason, "reason", self._rules, MAX_REASON)
        run = self._registry.get(task_id)
        if run is None:
            return self.store.send(task_id, action, reason)
        wake = self.wake
        if wake is not None and (pending := self._caps.commands.pending(task_id)):
            # Commands sent from elsewhere before this call are carried out first.
            receipt = self.store.queue(
                task_id, action, reason, status=run.snapshot().status, behind=pending[-1]
            )
            wake()
            return receipt
        outcome = act(run, action, reason, self._owner)
        return ControlReceipt(
            task_id=task_id, action=action, outcome=outcome, status=run.snapshot().status
        )
