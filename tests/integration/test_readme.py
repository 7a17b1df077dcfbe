"""Every Python example in README.md runs as printed, each in a fresh interpreter in an
empty directory (the PostgreSQL one against a database of its own on the test server)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.postgres_support import require_dsn

README = Path(__file__).resolve().parents[2] / "README.md"
PLACEHOLDER_DSN = "postgresql://app@db:5432/ops"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text("utf-8"), flags=re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_the_readme_has_its_examples() -> None:
    examples = _examples()
    assert len(examples) == 3, "a new example? give it a case below"
    assert sum(PLACEHOLDER_DSN in code for code in examples) == 1


@pytest.mark.parametrize(
    ("index", "prints"),
    [(0, "{'rows': 10000}"), (1, "succeeded 3")],
    ids=["use", "pipelines-and-schedules"],
)
def test_a_readme_example_runs_as_printed(tmp_path: Path, index: int, prints: str) -> None:
    code = _examples()[index]
    assert PLACEHOLDER_DSN not in code
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == prints, done.stdout
    assert "Traceback" not in done.stderr


def test_the_readme_postgres_example_runs_against_a_server(tmp_path: Path) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = require_dsn()
    database = f"chongming_readme_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")  # a generated name
    try:
        target = make_conninfo(**{**conninfo_to_dict(dsn), "dbname": database})
        url = _as_url(target)
        migrate = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", url, "migrate"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert migrate.returncode == 0, migrate.stderr
        code = next(c for c in _examples() if PLACEHOLDER_DSN in c)
        done = _run(code.replace(PLACEHOLDER_DSN, url), tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "hello ops"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def _as_url(conninfo: str) -> str:
    """A ``postgresql://`` URL for a conninfo (the CLI's --db takes URLs)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(conninfo)
    user = parts.get("user", "postgres")
    password = f":{parts['password']}" if parts.get("password") else ""
    host = parts.get("host", "127.0.0.1")
    port = parts.get("port", 5432)
    return f"postgresql://{user}{password}@{host}:{port}/{parts['dbname']}"
