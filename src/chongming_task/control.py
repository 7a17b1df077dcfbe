"""Control through a store, with no node: how the CLI, the dashboard and a node send a
stop, pause, resume or cancel for a task another process holds.

A task whose stored status already answers the call (it ended, it is stopping, a pause
of a paused task) is answered from that status and nothing is written, unless an
earlier command for the task is still pending: the call is then judged after it, so it
goes into the store behind it. Otherwise a ``Command`` goes into the store for the
holder's poller, and the answer is "request accepted" (docs/design.md, "Commands"): the
caller reads the task's status to see the effect (``wait_for``). A node sends a control
of a task it holds to the run itself (``node.commands.ControlRouter``) and only the
others through here.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from . import observe, states
from .errors import StoreUnavailable, TaskNotFound, WaitTimeout
from .limits import MAX_OWNER, MAX_REASON
from .model import Command, CommandAction, ControlOutcome, ControlReceipt, TaskSnapshot
from .model import TaskStatus as S
from .stores.capabilities import Capabilities
from .stores.protocol import TaskStore
from .values import check_text

__all__ = ["StoreControl", "answer_from_status"]


def answer_from_status(action: CommandAction, status: S) -> ControlOutcome | None:
    """What a control of a task held elsewhere comes to when its stored status already
    answers it (no command is written), else ``None``. A resume of a task that has not
    started still goes to its holder: a pause may be pending there."""
    if status in states.TERMINAL:
        return ControlOutcome.ALREADY_TERMINAL
    if status is S.STOPPING:
        return ControlOutcome.ALREADY_STOPPING
    if action is CommandAction.PAUSE and status in states.PAUSE_HELD:
        return ControlOutcome.ALREADY_PAUSED
    if action is CommandAction.RESUME and status is S.RUNNING:
        return ControlOutcome.NOT_PAUSED
    return None


_UNTIL_PENDING = frozenset({ControlOutcome.ALREADY_PAUSED, ControlOutcome.NOT_PAUSED})
"""Answers from a status that a pending command could still change."""


RESOLVE_WAIT = 3.0
"""Seconds a control whose command write failed with the store away asks whether it
was stored after all, before it says it cannot tell."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class StoreControl:
    """Sends controls into ``store`` as ``owner`` (the command's ``issued_by``)."""

    def __init__(
        self, store: TaskStore, *, owner: str, now: Callable[[], datetime] = _utc_now
    ) -> None:
        """``now`` gives the commands' creation time (UTC)."""
        self.store = store
        self.owner = owner
        self._now = now
        self._caps = Capabilities(store)
        self._rules = self._caps.value_rules
        check_text(owner, "owner", self._rules, MAX_OWNER)

    def send(
        self, task_id: str, action: CommandAction, reason: str | None = None
    ) -> ControlReceipt:
        """Answer ``action`` for ``task_id`` from its stored status, or write a command
        for its holder. ``TaskNotFound`` if the store has no such task; a reason the
        store cannot hold is refused here (``InvalidValue``), nothing written."""
        check_text(task_id, "task id", self._rules)
        if reason is not None:
            check_text(reason, "reason", self._rules, MAX_REASON)
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise TaskNotFound(f"no task {task_id} in {self.store!r}")
        watch = observe.watcher
        if watch is None:
            return self._answer(snapshot, action, reason)
        with watch.controlling(snapshot, action, reason, self.owner) as told:
            receipt = self._answer(snapshot, action, reason)
            told(receipt)
            return receipt

    def _answer(
        self, snapshot: TaskSnapshot, action: CommandAction, reason: str | None
    ) -> ControlReceipt:
        task_id = snapshot.task_id
        answered = answer_from_status(action, snapshot.status)
        behind: Command | None = None
        if answered in _UNTIL_PENDING:
            # A pause or resume answered from a status an earlier command is about to
            # change would contradict the operator's last word: queue it behind.
            pending = self._caps.commands.pending(task_id)
            if pending is None or pending:
                answered, behind = None, pending[-1] if pending else None
        if answered is not None:
            return ControlReceipt(
                task_id=task_id, action=action, outcome=answered, status=snapshot.status
            )
        return self.queue(task_id, action, reason, status=snapshot.status, behind=behind)

    def queue(
        self,
        task_id: str,
        action: CommandAction,
        reason: str | None,
        *,
        status: S,
        behind: Command | None = None,
    ) -> ControlReceipt:
        """Write ``action`` as a command for the task's holder, unjudged ("request
        accepted"); ``behind`` is the pending command it follows, if known."""
        command = Command(
            command_id=uuid.uuid4().hex,
            task_id=task_id,
            action=action,
            created_at=self._now(),
            issued_by=self.owner,
            reason=reason,
        )
        try:
            self.store.submit_command(command)
        except StoreUnavailable as exc:
            if not self._landed(command, exc):
                raise
        return ControlReceipt(
            task_id=task_id,
            action=action,
            outcome=ControlOutcome.ACCEPTED,
            command_id=command.command_id,
            status=status,
            behind=None if behind is None else behind.action,
            woken=self._caps.commands.wakes,
        )

    def _landed(self, command: Command, exc: StoreUnavailable) -> bool:
        """After ``submit_command`` failed with the store away: whether the command was
        stored all the same (its commit landed unheard: docs/design.md, "A commit nobody
        heard"), asked by its id for up to ``RESOLVE_WAIT`` seconds. ``False``: it was
        not (the failure stands). Still unknown then: ``StoreUnavailable`` saying the
        command may have been recorded, and how to tell."""
        deadline = time.monotonic() + RESOLVE_WAIT
        tick = threading.Event()
        while True:
            try:
                pending = self._caps.commands.pending(command.task_id)
                finished = self._caps.commands.finished(
                    after=command.created_at - timedelta(minutes=1), limit=10_000
                )
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    break
                tick.wait(0.1)
                continue
            if pending is None and not self._caps.commands.has_log:
                break  # the store cannot tell
            ids = {c.command_id for c in [*(pending or ()), *finished]}
            return command.command_id in ids
        raise StoreUnavailable(
            f"{exc}; the {command.action.value} command {command.command_id} for task "
            f"{command.task_id} may have been recorded all the same, and is carried out "
            "if it was (the task's history will show it)"
        ) from exc

    def wait_for(
        self,
        task_id: str,
        predicate: Callable[[TaskSnapshot], bool] = lambda s: s.is_terminal,
        *,
        timeout: float = 30.0,
        poll: float = 0.05,
    ) -> TaskSnapshot:
        """Read the task until ``predicate(snapshot)`` holds (default: it ended): the
        effect of an accepted command. ``WaitTimeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        tick = threading.Event()
        while True:
            snapshot = self.store.get(task_id)
            if snapshot is None:
                raise TaskNotFound(f"no task {task_id} in {self.store!r}")
            if predicate(snapshot):
                return snapshot
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} still {snapshot.status.value} after {timeout}s")
            tick.wait(poll)
