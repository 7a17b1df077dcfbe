"""The core imports nothing third-party; the Postgres driver stays optional."""

from __future__ import annotations

import subprocess
import sys

_BLOCK_DRIVER = (
    "import sys\n"
    "sys.modules['psycopg'] = None\n"  # as if the [postgres] extra were not installed
    "sys.modules['psycopg_pool'] = None\n"
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_import_chongming_task_loads_no_third_party_module() -> None:
    result = _run(
        "import sys, sysconfig\n"
        "before = set(sys.modules)\n"
        "import chongming_task, chongming_task.cli\n"
        "site = sysconfig.get_paths()['purelib']\n"
        "new = [m for m in set(sys.modules) - before\n"
        "       if (f := getattr(sys.modules[m], '__file__', None)) and f.startswith(site)\n"
        "       and not m.startswith('chongming_task')]\n"
        "print(sorted(new))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_without_the_driver_the_package_works_and_postgres_names_the_extra() -> None:
    result = _run(
        _BLOCK_DRIVER + "import chongming_task\n"
        "from chongming_task import Controller, InMemoryTaskStore\n"
        "with Controller(InMemoryTaskStore()) as c:\n"
        "    assert c.submit(c.task(lambda t: 1, name='one')).result(5) == 1\n"
        "try:\n"
        "    chongming_task.PostgresTaskStore('postgresql://u@127.0.0.1/db')\n"
        "except chongming_task.StoreError as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "chongming-task[postgres]"' in result.stdout


def test_the_cli_says_how_to_install_the_driver() -> None:
    result = _run(
        _BLOCK_DRIVER + "import sys\n"
        "from chongming_task.cli import main\n"
        "sys.exit(main(['--db', 'postgresql://u@127.0.0.1/db', 'ps']))\n"
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "chongming-task[postgres]" in result.stderr
    assert "Traceback" not in result.stderr


def test_web_without_its_extra_names_the_extra(tmp_path: object) -> None:
    result = _run(
        "import sys\n"
        "sys.modules['starlette'] = None\n"  # as if the [web] extra were not installed
        "sys.modules['uvicorn'] = None\n"
        "from chongming_task.cli import main\n"
        f"sys.exit(main(['--db', r'{tmp_path}/w.db', 'web']))\n"
    )
    assert result.returncode == 2, result.stderr
    assert 'needs the [web] extra: pip install "chongming-task[web]"' in result.stderr
    assert "Traceback" not in result.stderr


def test_otel_without_its_extra_names_the_extra() -> None:
    result = _run(
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if the [otel] extra were not installed
        "import chongming_task\n"
        "try:\n"
        "    import chongming_task.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert 'needs the [otel] extra: pip install "chongming-task[otel]"' in result.stdout
