"""A node's health: what it says of itself in its declaration (``NodeHealth``), and the
two watchers that make it: ``FaultLog`` (store writes failing: one line when it starts,
with its cause, a count while it lasts, one line when it ends) and ``ServiceWatch``
(service threads that died and were started again). docs/design.md, "Health".
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

__all__ = ["FaultLog", "HealthMonitor", "NodeHealth", "ServiceFault", "ServiceWatch", "one_line"]

RECENT = 60.0
"""Seconds a service's death keeps its node unhealthy after it runs again."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceFault:
    """A service thread of the node that died (and was started again)."""

    service: str
    deaths: int
    error: str
    """The last death's exception, in one line."""
    at: datetime
    """When it last died."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerProcesses:
    """A node's worker processes (``carrier="process"`` tasks): carrying a task now,
    idle, started in its life (replacements included), started in place of one that
    was retired, ended or died (replaced), and died on their own (crashed)."""

    busy: int = 0
    idle: int = 0
    started: int = 0
    replaced: int = 0
    crashed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHealth:
    """What a node says of itself: store writes failing, service threads that died,
    runs the store has moved on from (desynced). Healthy when none of the first two."""

    store_failing_since: datetime | None = None
    store_failures: int = 0
    store_error: str | None = None
    services: tuple[ServiceFault, ...] = ()
    """Services that died in this process's life, the latest first."""
    unhealthy_services: tuple[str, ...] = ()
    """Those that died in the last minute (or are not running again yet)."""
    desynced: int = 0
    """Runs whose stored task another writer ended (``lost`` by a reconcile, say)."""
    loop_stalls: int = 0
    """Times an async task blocked the node's event loop (sync work in ``async def``)."""
    connections: int | None = None
    """Server connections the node's store holds (``None``: a store without a server)."""
    processes: WorkerProcesses | None = None
    """Its worker processes (``None``: it has started none)."""

    @property
    def healthy(self) -> bool:
        return self.store_failing_since is None and not self.unhealthy_services

    def problems(self) -> list[str]:
        """What is wrong, one line each (empty when healthy)."""
        lines: list[str] = []
        if self.store_failing_since is not None:
            lines.append(
                f"store writes failing since {self.store_failing_since:%H:%M:%S} "
                f"({self.store_failures} failure(s)): {self.store_error}"
            )
        for fault in self.services:
            if fault.service in self.unhealthy_services:
                lines.append(
                    f"service {fault.service} died {fault.deaths} time(s), last at "
                    f"{fault.at:%H:%M:%S}: {fault.error}"
                )
        return lines

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "store_failing_since": _iso(self.store_failing_since),
            "store_failures": self.store_failures,
            "store_error": self.store_error,
            "services": [
                {"service": f.service, "deaths": f.deaths, "error": f.error, "at": _iso(f.at)}
                for f in self.services
            ],
            "unhealthy_services": list(self.unhealthy_services),
            "desynced": self.desynced,
            "loop_stalls": self.loop_stalls,
            "connections": self.connections,
        }
        if self.processes is not None:
            data["processes"] = asdict(self.processes)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> NodeHealth | None:
        """The health a node wrote (``None``: it wrote none; a text this release cannot
        read is taken as none rather than failing a whole listing)."""
        if not text:
            return None
        try:
            data = json.loads(text) if isinstance(text, str) else text
            return cls(
                store_failing_since=_time(data.get("store_failing_since")),
                store_failures=int(data.get("store_failures", 0)),
                store_error=data.get("store_error"),
                services=tuple(
                    ServiceFault(
                        service=str(f["service"]),
                        deaths=int(f["deaths"]),
                        error=str(f["error"]),
                        at=_time(f["at"]) or datetime.fromtimestamp(0, UTC),
                    )
                    for f in data.get("services", ())
                ),
                unhealthy_services=tuple(str(s) for s in data.get("unhealthy_services", ())),
                desynced=int(data.get("desynced", 0)),
                loop_stalls=int(data.get("loop_stalls", 0)),
                connections=None if data.get("connections") is None else int(data["connections"]),
                processes=_processes(data.get("processes")),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def as_dict(self) -> dict[str, Any]:
        """For ``--json`` output."""
        data: dict[str, Any] = json.loads(self.to_json())
        data["healthy"] = self.healthy
        return data


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


class FaultLog:
    """Store faults as episodes, so a full disk logs two lines, not one a task a pass:
    the first failure logs one line with its cause; later ones are counted; once writes
    have succeeded and none failed for ``quiet`` seconds, one line says it ended."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        now: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
        quiet: float = 5.0,
    ) -> None:
        self._log = logger
        self._now = now
        self._monotonic = monotonic
        self._quiet = quiet
        self._lock = threading.Lock()
        self.since: datetime | None = None
        """When the current episode began (``None``: writes are not failing)."""
        self.count = 0
        self.cause: str | None = None
        self._started = 0.0
        self._last_failure = 0.0
        self._succeeded_after = False

    def failed(self, what: str, exc: BaseException) -> None:
        """A store write failed (``what``: which one)."""
        with self._lock:
            self._last_failure = self._monotonic()
            self._succeeded_after = False
            self.count += 1
            if self.since is not None:
                return
            self.since = self._now()
            self._started = self._last_failure
            self.cause = one_line(exc)
        self._log.error(
            "store writes failing (%s, first: %s); counting until they succeed again",
            self.cause,
            what,
        )

    def succeeded(self) -> None:
        """A store write succeeded: the episode ends once none fails for ``quiet`` s."""
        with self._lock:
            if self.since is None:
                return
            self._succeeded_after = True
        self.check()

    def check(self) -> None:
        """End the episode if writes succeed and none failed for ``quiet`` seconds."""
        with self._lock:
            if self.since is None or not self._succeeded_after:
                return
            now = self._monotonic()
            if now - self._last_failure < self._quiet:
                return
            lasted, count, cause = now - self._started, self.count, self.cause
            self.since, self.count, self.cause = None, 0, None
        self._log.warning(
            "store writes succeed again, after %d failure(s) in %.1f s (%s)",
            count,
            lasted,
            cause,
        )


@dataclass
class _Deaths:
    deaths: int = 0
    error: str = ""
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    died_mono: float = 0.0
    running: bool = True


class ServiceWatch:
    """The node's service threads that died: told by each thread's guard
    (``loops.keep_running``), read into ``NodeHealth``."""

    def __init__(
        self, *, now: Callable[[], datetime], monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._now = now
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._services: dict[str, _Deaths] = {}

    def died(self, service: str, exc: BaseException) -> None:
        with self._lock:
            entry = self._services.setdefault(service, _Deaths())
            entry.deaths += 1
            entry.error = one_line(exc)
            entry.at = self._now()
            entry.died_mono = self._monotonic()
            entry.running = False

    def restarted(self, service: str) -> None:
        with self._lock:
            entry = self._services.get(service)
            if entry is not None:
                entry.running = True

    def faults(self) -> tuple[tuple[ServiceFault, ...], tuple[str, ...]]:
        """Every service that died (latest first), and those unhealthy now: not running
        again yet, or died less than a minute ago."""
        now = self._monotonic()
        with self._lock:
            items = sorted(self._services.items(), key=lambda kv: kv[1].at, reverse=True)
            faults = tuple(
                ServiceFault(service=name, deaths=e.deaths, error=e.error, at=e.at)
                for name, e in items
            )
            unhealthy = tuple(
                name for name, e in items if not e.running or now - e.died_mono < RECENT
            )
        return faults, unhealthy


def _processes(data: Any) -> WorkerProcesses | None:
    if not isinstance(data, dict):
        return None
    return WorkerProcesses(**{f.name: int(data.get(f.name, 0)) for f in fields(WorkerProcesses)})


class HealthMonitor:
    """One node's health watchers: its store faults and its service threads."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        now: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.faults = FaultLog(logger, now=now, monotonic=monotonic)
        self.watch = ServiceWatch(now=now, monotonic=monotonic)
        self.loop_stalls = 0
        self.processes: Callable[[], WorkerProcesses | None] | None = None
        """How the node's worker processes stand (set where it has them)."""

    def loop_stalled(self) -> None:
        self.loop_stalls += 1

    def report(self, *, desynced: int, connections: int | None = None) -> NodeHealth:
        self.faults.check()
        services, unhealthy = self.watch.faults()
        return NodeHealth(
            store_failing_since=self.faults.since,
            store_failures=self.faults.count if self.faults.since is not None else 0,
            store_error=self.faults.cause,
            services=services,
            unhealthy_services=unhealthy,
            desynced=desynced,
            loop_stalls=self.loop_stalls,
            connections=connections,
            processes=None if self.processes is None else self.processes(),
        )
