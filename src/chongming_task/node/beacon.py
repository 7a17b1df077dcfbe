"""The node beacon: a worker node's declaration in the store (docs/design.md, "Fleet
declarations").

At start-up the node writes who it is and which buckets it declares (``NodeRecord``),
then refreshes ``seen_at`` about every third of its lease TTL while it lives, and marks
itself stopped at a clean ``close()``. The first refresh comes at a random point of the
first third and each later one within 10 % of a third: nodes started together (a
deployment) do not beat in step, so a fleet's beacons reach the store evenly. Other
nodes and the CLI (``nodes``, ``doctor``) read these declarations to find buckets
declared twice, buckets nobody declares, and tasks nobody looks after. The declaration
decides nothing: no node consults it before running or reconciling a task (it is no
bucket lease: nodes never take buckets from each other).

Where the store pulses (``FleetRegistry``), the refresh also counts the open
commands this node may claim, and the beacon wakes the command poller if there are: the
poller's safety net then costs no statement of its own.

A store without a fleet registry, or a failing write, costs the node nothing
but a logged warning: visibility never stops a node from running its tasks.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Callable
from datetime import datetime

from ..errors import StoreError
from ..fleet import AlarmKind, bucket_alarms
from ..health import NodeHealth
from ..model import NodeRecord
from .services import LoopService, NodeContext, Pass

__all__ = ["NodeBeacon"]

log = logging.getLogger("chongming_task.fleet")


class NodeBeacon(LoopService):
    """Declares the node, keeps its declaration fresh, retires it at ``close()``."""

    def __init__(
        self,
        node: NodeContext,
        *,
        buckets: frozenset[int] | None,
        num_buckets: int,
        ttl: float,
    ) -> None:
        super().__init__()
        self.name = f"chongming-beacon[{node.owner}]"
        self.interval = ttl / 3
        self._owner = node.owner
        self._caps = node.capabilities
        self._now = node.now
        self._buckets = buckets
        self._num_buckets = num_buckets
        self._ttl = ttl
        self._health = node.health
        self._registry = node.registry
        self._declared = False
        self._rng = random.Random()
        self.commands_waiting: Callable[[], None] | None = None
        """Called when a refresh finds open commands nobody holds (the poller's wake)."""

    def health(self) -> NodeHealth:
        """What the node says of itself now (written with every refresh)."""
        return self._health.report(
            desynced=len(self._registry.desynced()), connections=self._caps.connections()
        )

    def record(self, now: datetime) -> NodeRecord:
        return NodeRecord(
            node=self._owner,
            buckets=self._buckets,
            num_buckets=self._num_buckets,
            ttl_seconds=self._ttl,
            started_at=now,
            seen_at=now,
            host=socket.gethostname(),
            pid=os.getpid(),
            health=self.health(),
        )

    def run_once(self, now: float | None = None) -> Pass:
        """Refresh the declaration (``done``: 1), or make it again if it is gone."""
        caps = self._caps
        if not caps.has_fleet_registry:
            return Pass(wait=3600.0)  # nothing to declare to; stop() still ends the loop
        try:
            if self._declared:
                # One statement: the declaration refreshed, and the command queue looked
                # at (the poller's safety net, where the store pulses).
                waiting = caps.pulse_node(self._owner, now=self._now(), health=self.health())
                if waiting is not None:
                    if waiting and self.commands_waiting is not None:
                        self.commands_waiting()
                    self._health.faults.succeeded()
                    return Pass(done=1, wait=self.interval * self._rng.uniform(0.9, 1.1))
            self._declare()
        except StoreError as exc:  # one line an episode, with the node's other faults
            self._health.faults.failed("node declaration", exc)
            return Pass(wait=min(self.interval, 1.0))
        self._health.faults.succeeded()
        return Pass(done=1, wait=self.interval * self._rng.random())

    def _declare(self) -> None:
        """Write the declaration, then say what clashes with it (a warning per clash)."""
        record = self.record(self._now())
        declared = self._caps.nodes()
        live = [n for n in declared if n.node != record.node and n.is_live(record.seen_at)]
        twins = [n for n in declared if _twin(n, record)]
        self._caps.declare_node(record)
        self._declared = True
        for twin in twins:
            ago = (record.seen_at - twin.seen_at).total_seconds()
            log.warning(
                "node %s: this name is declared by another live process too (host %s, "
                "pid %s, seen %.0f s ago). Nodes that share a name show as one in `nodes` "
                "and `doctor`, and a clean stop of either marks both stopped: give each "
                "node its own owner name (the default, host:pid, is unique)",
                record.node,
                twin.host,
                twin.pid,
                max(ago, 0.0),
            )
        # The fleet's own judgement (doctor raises the same alarms), for this node: a
        # bucket count other than its own, or a bucket it shares with a live node.
        for alarm in bucket_alarms([record, *live], record.num_buckets):
            if alarm.kind is AlarmKind.NUM_BUCKETS_MISMATCH or record.node in alarm.nodes:
                log.warning("node %s: %s", record.node, alarm.message)

    def retire(self) -> None:
        """Mark the declaration stopped (a clean close): its buckets are then uncovered,
        and the tools say so rather than wait for it to go stale."""
        if not self._declared:
            return
        try:
            self._caps.retire_node(self._owner, now=self._now())
        except StoreError as exc:
            log.warning("node %s: could not mark itself stopped (%s)", self._owner, exc)


def _twin(declared: NodeRecord, mine: NodeRecord) -> bool:
    """Whether ``declared`` is another process's live declaration of ``mine``'s name. A
    process of this host that has exited is this node's predecessor (a restart after a
    crash), not a twin; on another host nobody can tell, and the warning says "seen"."""
    if declared.node != mine.node or not declared.is_live(mine.seen_at):
        return False
    if (declared.host, declared.pid) == (mine.host, mine.pid):
        return False
    # (On Windows kill would end the process; a pid of 0 or less names a group.)
    if declared.host == mine.host and declared.pid > 0 and os.name == "posix":
        try:
            os.kill(declared.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
    return True
