"""A first connection to PostgreSQL that cannot succeed says what is wrong at once, in
one line a user acts on: a password missing or refused (on a throwaway cluster of this
test's own that asks for one), nothing listening on the port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psycopg

from tests.integration.pg_cluster import ThrowawayCluster
from tests.integration.pg_cluster import throwaway_cluster as throwaway_cluster


def ps(dsn: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``ps`` on ``dsn``, given in the environment (a password on the command line is
    refused), with no password of the test session's beside it."""
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "CHONGMING_DB": dsn},
    )
    return result, time.monotonic() - start


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_password_missing_or_refused_is_said_at_once(
    throwaway_cluster: ThrowawayCluster,
) -> None:
    cluster = throwaway_cluster
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute("ALTER ROLE postgres PASSWORD 'right-one'")
    (cluster.data / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    cluster.reload()
    base = f"127.0.0.1:{cluster.port}/postgres"
    missing, took = ps(f"postgresql://postgres@{base}")
    line = one_line(missing)
    assert "asks for a password" in line and "PGPASSWORD" in line and "~/.pgpass" in line
    assert took < 4.5, f"took {took:.1f}s: waited instead of saying"
    wrong, took = ps(f"postgresql://postgres:wrong-one@{base}")
    assert "password was refused" in one_line(wrong) and took < 4.5
    assert "wrong-one" not in wrong.stderr  # a password is never echoed
    right, _ = ps(f"postgresql://postgres:right-one@{base}")
    assert right.returncode == 1 and "migrate" in right.stderr  # in: no schema yet


def test_nothing_listening_is_said_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nobody listens once closed
    result, took = ps(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    line = one_line(result)
    assert "nothing listens there (connection refused)" in line, line
    assert took < 4.5, f"took {took:.1f}s: waited instead of saying"
