"""Generated text, numbers and durations thrown at the command line's parser and
commands, and at ``task.configure(...)``. The only outcomes allowed: an answer, or a
one-line error with a non-zero exit (CLI); ``InvalidValue`` or ``TypeError`` (library).
Never a traceback."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_task import Controller, InMemoryTaskStore, InvalidValue, SqliteTaskStore
from chongming_task.cli import main

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30
) | st.sampled_from(["", " ", "-1", "0", "nan", "inf", "-inf", "1e20", "9" * 30, "0-99999999"])
NUMBER = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "1e308", "-0", "0x10", "1_000", "１２"]),
)
DURATION = st.one_of(
    NUMBER,
    st.tuples(NUMBER, st.sampled_from(["s", "m", "h", "d", "w", "y", "", "ms"])).map("".join),
)

FLAGS = {
    "--limit": NUMBER,
    "--older-than": DURATION,
    "--name": TEXT,
    "--tag": TEXT,
    "--node": TEXT,
    "--pipeline": TEXT,
    "--bucket": NUMBER,
    "--status": st.sampled_from(["queued", "running", "succeeded", "bogus", ""]),
    "--dedupe-key": TEXT,
}
COMMANDS = {
    "ps": FLAGS,
    "stats": {},
    "buckets": {},
    "nodes": {},
    "schedules": {},
    "doctor": {"--orphan-after": NUMBER, "--stale-after": NUMBER, "--limit": NUMBER},
    "pause": {**FLAGS, "--dry-run": st.just(None), "--wait": NUMBER},
    "prune": {"--older-than": DURATION, "--keep": NUMBER, "--dry-run": st.just(None)},
    "show": {},
    "history": {"--since": NUMBER},
    "watch": {"--interval": NUMBER, "--count": st.just("1")},
}
GLOBAL = {"--num-buckets": NUMBER, "--owned-buckets": TEXT | NUMBER, "--pg-schema": TEXT}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    words: list[str] = []
    flags = {**COMMANDS[command], **GLOBAL}
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=4, unique=True)):
        value = draw(flags[flag])
        words += [flag] if value is None else [flag, value]
    if command in ("show", "history"):
        words.insert(0, draw(TEXT.filter(lambda t: not t.startswith("-")) | st.just("abcdef")))
    if command == "pause" and "--dry-run" not in words:
        words.append("--dry-run")  # a selection without --yes is refused; never sent here
    if command == "prune" and "--dry-run" not in words:
        words.append("--dry-run")
    if command == "watch" and "--count" not in words:
        words += ["--count", "1"]
    return [command, *words]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("hostile") / "hostile.db"
    SqliteTaskStore(path).close()
    yield path


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=command_lines())
def test_the_command_line_answers_or_refuses_in_one_line(db: Path, argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--db", str(db), *argv])
        except SystemExit as exc:  # argparse's --help / --version only
            code = int(exc.code or 0)
    said = err.getvalue()
    assert "Traceback" not in said, (argv, said)
    assert code in (0, 1, 2, 3), (argv, code, said)
    if code in (1, 2):
        assert said.startswith("chongming-task: error: "), (argv, said)
        assert len(said.strip().splitlines()) == 1, (argv, said)


def _noop(token: object) -> None:
    return None


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=600),
    st.binary(max_size=10),
    st.lists(st.text(max_size=5), max_size=3),
    st.frozensets(st.text(max_size=300), max_size=70),
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.none()
    ),
    st.datetimes(timezones=st.just(UTC)),
    st.timedeltas(max_value=timedelta(days=5)),
    st.sampled_from(["return", "raise", "ignore", float("nan"), math.inf, -1.0]),
    st.just(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))),
)
OPTIONS = st.dictionaries(
    st.sampled_from(
        [
            "delay",
            "run_at",
            "priority",
            "dedupe_key",
            "on_duplicate",
            "dedupe_window",
            "concurrency_key",
            "bucket_key",
            "tags",
        ]
    ),
    VALUES,
    max_size=4,
)


@pytest.fixture(scope="module")
def node() -> Iterator[Controller]:
    with Controller(InMemoryTaskStore(), max_workers=1) as made:
        made.task(_noop, name="noop")
        yield made


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(options=OPTIONS)
def test_options_take_a_value_or_refuse_it(node: Controller, options: dict[str, object]) -> None:
    try:
        submitter = node.tasks["noop"].configure(**options)  # type: ignore[arg-type]
    except (InvalidValue, TypeError):
        return
    try:
        run = submitter.submit()
    except (InvalidValue, TypeError):
        return  # checked against the store at submit (UTF-8, NUL)
    node.cancel(run.task_id)
