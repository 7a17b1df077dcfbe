"""What a SQLite commit survives is a setting of the store, read back from its own
connection, and it changes what the process asks of the disk: with ``full`` each commit
is flushed (``fdatasync``), with ``normal`` only checkpoints are."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chongming_task import ConfigurationError, SqliteTaskStore
from chongming_task.cli.context import Context
from chongming_task.cli.parser import build_parser
from chongming_task.stores import open_store
from chongming_task.stores.sqlite.store import DEFAULT_DURABILITY

_SYNCHRONOUS = {1: "normal", 2: "full"}  # what PRAGMA synchronous answers


def synchronous(store: SqliteTaskStore) -> str:
    with store.connection.read("test") as conn:
        (level,) = conn.execute("PRAGMA synchronous").fetchone()
    return _SYNCHRONOUS[level]


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_the_setting_is_the_connections(tmp_path: Path, durability: str) -> None:
    store = open_store(tmp_path / "t.db", durability=durability)  # type: ignore[arg-type]
    try:
        assert isinstance(store, SqliteTaskStore)
        assert store.durability == durability
        assert synchronous(store) == durability
    finally:
        store.close()


def test_the_default_is_the_documented_one(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    try:
        assert synchronous(store) == DEFAULT_DURABILITY == store.durability
    finally:
        store.close()


def test_an_unknown_setting_is_refused_before_the_file_is_touched(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="durability must be one of full, normal"):
        SqliteTaskStore(tmp_path / "t.db", durability="fsync")  # type: ignore[arg-type]
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--sqlite-durability", "full", "ps"], {}, "full"),
        (["ps", "--sqlite-durability", "normal"], {}, "normal"),
        (["ps"], {"CHONGMING_SQLITE_DURABILITY": "full"}, "full"),
        (["ps"], {"CHONGMING_SQLITE_DURABILITY": "normal"}, "normal"),
    ],
)
def test_the_cli_opens_the_store_with_the_flag_or_its_environment(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    environ: dict[str, str],
    expected: str,
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["--db", str(tmp_path / "t.db"), *argv])
    ctx = Context(args)
    try:
        store = ctx.store(create=True)
        assert isinstance(store, SqliteTaskStore)
        assert synchronous(store) == expected
    finally:
        ctx.close()


def test_a_bad_environment_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(tmp_path / "t.db"), "ps"],
        capture_output=True,
        text=True,
        env={"CHONGMING_SQLITE_DURABILITY": "sometimes", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 2
    assert "CHONGMING_SQLITE_DURABILITY" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.db").exists()


_FIFTY_TASKS = textwrap.dedent(
    """
    import sys
    from chongming_task import Controller, SqliteTaskStore

    def noop(token):
        pass

    node = Controller(SqliteTaskStore(sys.argv[1], durability=sys.argv[2]))
    task = node.task(noop)
    for _ in range(50):
        node.submit(task).result(timeout=30)
    node.close()
    """
)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to count syncs")
def test_full_flushes_every_commit_and_normal_does_not(tmp_path: Path) -> None:
    """50 tasks one after another: at least one commit each (the create; the start and
    the success may share one). Counted by strace, in a child process."""
    script = tmp_path / "fifty.py"
    script.write_text(_FIFTY_TASKS)
    syncs: dict[str, int] = {}
    for durability in ("full", "normal"):
        counted = tmp_path / f"strace-{durability}"
        subprocess.run(
            [
                "strace",
                "-f",
                "-c",
                "-e",
                "trace=fsync,fdatasync",
                "-o",
                str(counted),
                sys.executable,
                str(script),
                str(tmp_path / f"{durability}.db"),
                durability,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        syncs[durability] = sum(
            int(line.split()[3])
            for line in counted.read_text().splitlines()
            if line.split()[-1:] in (["fsync"], ["fdatasync"])
        )
    assert syncs["full"] >= 50, syncs
    assert syncs["normal"] < 25, syncs
