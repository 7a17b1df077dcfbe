"""A throwaway PostgreSQL cluster for tests that need a server outage.

A test suite never stops a server it did not start. Tests that take the server away
start their own cluster here (``initdb`` + ``pg_ctl`` in a temporary directory, on a free
port of the loopback address), stop and start it as they please, and remove it. Where
the binaries are missing the test is skipped visibly; in CI (which installs them) it
fails instead.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: p.split("/")[-2])
    for candidate in reversed(versions):
        if (Path(candidate) / "pg_ctl").exists() and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayCluster:
    """One PostgreSQL cluster of this test's own: ``dsn``, ``stop()``, ``start()``."""

    def __init__(self, bindir: Path, settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        # Fast and throwaway unless told otherwise (a benchmark asks for fsync).
        self.settings = {"fsync": "off", "full_page_writes": "off", **(settings or {})}
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="chongming-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        # PostgreSQL refuses to run as root: as root, run it as the postgres user.
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {result.stderr.strip()}\n{log[-2000:]}")

    def init(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 " + " ".join(
            f"-c {name}={value}" for name, value in self.settings.items()
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )

    def reload(self) -> None:
        """Have the server read its configuration again (``pg_hba.conf``)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "reload")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def unavailable_reason() -> str | None:
    if _bindir() is None:
        return "initdb/pg_ctl not found (install PostgreSQL's server binaries)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root needs a postgres user to run the throwaway server"
        if shutil.which("runuser") is None:
            return "running as root needs runuser to run the throwaway server"
    return None


def start_throwaway() -> ThrowawayCluster:
    """Start a cluster (the caller checked ``unavailable_reason()``); removed if it
    fails to start."""
    bindir = _bindir()
    assert bindir is not None
    cluster = ThrowawayCluster(bindir)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.remove()
        raise
    return cluster


@pytest.fixture
def throwaway_cluster() -> Iterator[ThrowawayCluster]:
    """A running cluster of this test's own, removed afterwards."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to start a throwaway PostgreSQL: {reason}")
        pytest.skip(reason)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (the [postgres] extra)")
    cluster = start_throwaway()
    try:
        yield cluster
    finally:
        cluster.remove()
