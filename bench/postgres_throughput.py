"""Durable no-op task throughput on PostgreSQL: chongming-task vs procrastinate, pgqueuer.

    uv run --group bench python bench/postgres_throughput.py [--dsn DSN] [--tasks N]
        [--rounds R] [--skip procrastinate]

Each contender runs ``--tasks`` no-op jobs on ``--workers`` workers against the same
local server, in the same run, each in a fresh database, in two modes:

* **prefilled**: every job is enqueued first (untimed), then the workers start; the time
  is from the first job's function starting until every job's completion is in the
  database;
* **as you go**: the jobs are submitted one by one while the workers run; the time is
  from the first submit until every job's completion is in the database.

"In the database" is seen the same way for every contender: once the last job's function
has ended, a watcher on its own connection asks the contender's own table how many jobs
are not yet complete (chongming-task: tasks not ``succeeded``; procrastinate: jobs not
``succeeded``; pgqueuer: jobs still in its queue table, which it deletes on completion)
every millisecond, and the time ends at the first answer of none. A contender that
completes its jobs in buffered batches after the function returns (pgqueuer's status
log buffer; chongming-task's writer thread) is timed to its commit, never to its
function's end; "tail ms" (of the best run) is that wait, from the last function's end
to the last completion seen. The watcher's own queries are taken off the commit counts.
Neither window holds a contender's start-up or shutdown (pgqueuer's drain mode waits for
its dequeue timeout before it stops; procrastinate's worker shuts down after the queue
is empty). How:

* chongming-task: ``Controller.submit`` per job (one transaction each); every task lives
  queued -> starting -> running -> succeeded, each transition committed with its
  audit-trail rows. Prefilled: ``--workers`` gate tasks hold every worker while the jobs
  are submitted, then are released (their last writes land before the first job starts);
* procrastinate (its async API, its fastest): ``defer_async`` per job;
  ``run_worker_async(concurrency=--workers)``;
* pgqueuer (async, psycopg driver): ``enqueue`` per job; ``QueueManager.run`` with its
  default batch size, its async jobs on one event loop (an entrypoint
  ``concurrency_limit`` of ``--workers`` made 1.6.0's drain mode hang; for a no-op the
  limit changes nothing).

The contenders run in ``--rounds`` rounds, each round every contender once (the order
turning from round to round). "vs pgq" is each round's ratio to pgqueuer, between runs
made side by side, and "median" their median: this VM drifts by tens of per cent over
minutes, so one contender's runs back to back against the other's compared moments, not
contenders. "best/s" is a contender's best run. "steady/s" is the median over the rounds
of each run's rate while the middle 80 % of its jobs completed, seen in the database by
the same watcher (it counts the incomplete jobs every 10 ms from the start): the rate
once running, as pgqueuer 1.6 stalls about a second after its first jobs in every drain
run, which weighs on its whole-window rate less the more jobs a run has. Its "vs pgq" is
the median of that rate's ratios to pgqueuer's, round by round.

Beside each rate: commits, rows written (inserted + updated + deleted) and WAL bytes per
job, from the deltas of ``pg_stat_database`` (the contender's own database) and
``pg_stat_wal`` over the whole life of the jobs (enqueue to completion), read after the
contender's connections closed (a backend flushes its counters when it ends). And the
raw rate of one connection committing one-row inserts, the floor of a durable write on
this server, measured in the same run. procrastinate and pgqueuer are benchmark-only
dependencies (the ``bench`` group), never runtime ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from _stats import in_rounds  # bench/ is on sys.path when run as a script
from chongming_task import CancellationToken, Controller
from chongming_task.stores.postgres import PostgresTaskStore

BENCH_DB = "chongming_bench"
MODES = ("prefilled", "as you go")


@dataclass
class Result:
    seconds: float
    commits: float
    rows: float
    wal_bytes: float
    tail: float
    """Seconds from the last job's function ending until every job was complete in the
    database."""
    steady: float
    """Jobs a second while the middle 80 % of the jobs completed (``Settled.steady``)."""


class Span:
    """Each job's function start and end (thread-safe appends), and a wait for all."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self.enqueued = 0  # jobs handed to the contender so far (the bench's loop counts)
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.done = threading.Event()
        self.settled: Settled | None = None  # the watcher, set by Settled

    def start(self) -> None:
        self.starts.append(time.perf_counter())

    def end(self) -> None:
        self.ends.append(time.perf_counter())
        if len(self.ends) >= self.tasks:
            self.done.set()

    def seconds(self, since: float | None = None) -> float:
        """From the first start (or ``since``) until every job was seen complete in the
        database (``Settled``)."""
        assert len(self.ends) == self.tasks, (len(self.ends), self.tasks)
        assert self.settled is not None, "no watcher saw the jobs complete"
        return self.settled.wait() - (min(self.starts) if since is None else since)


class Settled:
    """Asks ``remaining`` (a count of the jobs not yet complete in the contender's own
    table) on a connection of its own: every 10 ms from the start, to see the jobs
    complete as they go (``steady``), then, once every job's function has ended, every
    millisecond until it answers 0; ``wait()`` gives the moment it did. ``polls``: its
    queries (each a transaction, taken off the contender's commit count)."""

    def __init__(self, conninfo: str, span: Span, remaining: str) -> None:
        self.polls = 0
        self.tail = 0.0
        self.samples: list[tuple[float, int]] = []  # (time, jobs complete in the database)
        self._at: float | None = None
        self._error: BaseException | None = None
        self._span = span
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._remaining = remaining
        span.settled = self
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _count(self) -> int:
        self.polls += 1
        enqueued = self._span.enqueued
        row = self._conn.execute(self._remaining).fetchone()
        remaining = 0 if row is None else int(row[0])
        self.samples.append((time.perf_counter(), enqueued - remaining))
        return remaining

    def _watch(self) -> None:
        try:
            deadline = time.monotonic() + 300
            while not self._span.done.wait(0.01):
                self._count()
                if time.monotonic() > deadline:
                    return
            while self._count() != 0:
                time.sleep(0.001)
            self._at = self.samples[-1][0]
            self.tail = self._at - max(self._span.ends)
        except BaseException as exc:
            self._error = exc

    def wait(self) -> float:
        self._thread.join(120)
        if self._at is None:
            raise RuntimeError(f"the jobs were never seen complete: {self._error!r}")
        return self._at

    def steady(self) -> float:
        """Jobs a second from the first moment 10 % of the jobs were complete in the
        database to the first moment 90 % were: the rate once a contender runs, without
        its start-up or its last stragglers (a fixed stall at the start weighs less the
        longer a run is, and would make the ratio depend on ``--tasks``). Seen by the
        same polls for every contender, so a contender that completes in batches behind
        its functions is timed to its commits."""
        tasks = self._span.tasks
        low = next((t, n) for t, n in self.samples if n >= tasks // 10)
        high = next((t, n) for t, n in self.samples if n >= tasks * 9 // 10)
        return (high[1] - low[1]) / (high[0] - low[0])

    def close(self) -> None:
        self._conn.close()


def fresh_database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return make_conninfo(**{**conninfo_to_dict(dsn), "dbname": name})


def counters(dsn: str) -> tuple[int, int, int]:
    """Commits and rows written in the bench database, and WAL bytes of the server."""
    time.sleep(0.5)  # backends that just closed have flushed their counters
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_stat_clear_snapshot()")
        row = admin.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = %s",
            [BENCH_DB],
        ).fetchone()
        wal = admin.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()
    assert row is not None and wal is not None
    return int(row[0]), int(row[1]), int(wal[0])


def measured(
    dsn: str, conninfo: str, tasks: int, remaining: str, body: Callable[[Span], float]
) -> Result:
    before = counters(dsn)
    span = Span(tasks)
    settled = Settled(conninfo, span, remaining)
    try:
        seconds = body(span)
    finally:
        settled.close()
    after = counters(dsn)
    commits, rows, wal = (b - a for a, b in zip(before, after, strict=True))
    return Result(
        seconds,
        (commits - settled.polls) / tasks,
        rows / tasks,
        wal / tasks,
        settled.tail,
        settled.steady(),
    )


def run_chongming(dsn: str, tasks: int, workers: int, mode: str) -> Result:
    conninfo = fresh_database(dsn, BENCH_DB)
    made = PostgresTaskStore(conninfo)
    made.create_schema()
    made.close()

    def body(span: Span) -> float:
        store = PostgresTaskStore(conninfo, max_size=workers + 4)
        node = Controller(store, max_workers=workers)
        gate = threading.Event()

        @node.task(name="noop")
        def noop(token: CancellationToken) -> None:
            span.start()
            span.end()

        @node.task(name="gate")
        def hold(token: CancellationToken) -> None:
            gate.wait(60)

        try:
            runs = []

            def submit_all() -> None:
                for _ in range(tasks):
                    runs.append(node.submit(noop))
                    span.enqueued += 1

            if mode == "prefilled":
                gates = [node.submit(hold) for _ in range(workers)]
                submit_all()
                gate.set()
                since = None
            else:
                gate.set()
                gates = []
                since = time.perf_counter()
                submit_all()
            assert span.done.wait(300)
            for run in runs + gates:
                run.wait(60)
            assert all(r.status.value == "succeeded" for r in runs)
            return span.seconds(since)
        finally:
            node.close()
            store.close()

    return measured(
        dsn,
        conninfo,
        tasks,
        "SELECT count(*) FROM chongming.tasks WHERE name = 'noop' AND status <> 'succeeded'",
        body,
    )


def run_procrastinate(dsn: str, tasks: int, workers: int, mode: str) -> Result:
    import procrastinate

    conninfo = fresh_database(dsn, BENCH_DB)

    def app_with(span: Span) -> procrastinate.App:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

        @app.task(name="noop")
        async def noop() -> None:
            span.start()
            span.end()

        return app

    async def install() -> None:
        app = app_with(Span(0))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())

    def body(span: Span) -> float:
        app = app_with(span)
        noop = app.tasks["noop"]

        async def main() -> float:
            async with app.open_async():
                if mode == "prefilled":
                    for _ in range(tasks):
                        await noop.defer_async()
                        span.enqueued += 1
                    await app.run_worker_async(
                        concurrency=workers, wait=False, install_signal_handlers=False
                    )
                    return await asyncio.to_thread(span.seconds)
                worker = asyncio.create_task(
                    app.run_worker_async(
                        concurrency=workers, wait=True, install_signal_handlers=False
                    )
                )
                since = time.perf_counter()
                for _ in range(tasks):
                    await noop.defer_async()
                    span.enqueued += 1
                while not span.done.is_set():
                    await asyncio.sleep(0.01)
                seconds = await asyncio.to_thread(span.seconds, since)
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
                return seconds

        return asyncio.run(main())

    return measured(
        dsn,
        conninfo,
        tasks,
        "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
        body,
    )


def run_pgqueuer(dsn: str, tasks: int, workers: int, mode: str) -> Result:
    from datetime import timedelta

    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conninfo = fresh_database(dsn, BENCH_DB)

    async def install() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    asyncio.run(install())

    def body(span: Span) -> float:

        async def main() -> float:
            worker_conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            client_conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            manager = QueueManager(Queries(PsycopgDriver(worker_conn)))

            @manager.entrypoint("noop")
            async def noop(job: object) -> None:
                span.start()
                span.end()

            client = Queries(PsycopgDriver(client_conn))
            try:
                if mode == "prefilled":
                    for _ in range(tasks):
                        await client.enqueue("noop", None)
                        span.enqueued += 1
                    await manager.run(
                        mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1)
                    )
                    return await asyncio.to_thread(span.seconds)
                runner = asyncio.create_task(manager.run(dequeue_timeout=timedelta(seconds=1)))
                since = time.perf_counter()
                for _ in range(tasks):
                    await client.enqueue("noop", None)
                    span.enqueued += 1
                while not span.done.is_set():
                    await asyncio.sleep(0.01)
                seconds = await asyncio.to_thread(span.seconds, since)
                manager.shutdown.set()
                await runner
                return seconds
            finally:
                await worker_conn.close()
                await client_conn.close()

        return asyncio.run(main())

    return measured(dsn, conninfo, tasks, "SELECT count(*) FROM pgqueuer", body)


def raw_commits(dsn: str, count: int) -> float:
    """One connection, autocommit, one-row INSERT per commit: commits a second."""
    conninfo = fresh_database(dsn, BENCH_DB)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_commit (id BIGSERIAL PRIMARY KEY, v INTEGER)")
        start = time.perf_counter()
        for _ in range(count):
            conn.execute("INSERT INTO raw_commit (v) VALUES (1)")
        return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    # 4,000: with 2,000, pgqueuer had not reached its steady rate (1,158-1,389 jobs/s
    # prefilled against 1,747-1,759 with 4,000, in one run), which flattered us.
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["procrastinate"],  # pgqueuer is the reference of every ratio
        help="leave a contender out",
    )
    args = parser.parse_args()
    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its top-level-app hint
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    contenders: dict[str, Callable[[str, int, int, str], Result]] = {
        name: fn
        for name, fn in {
            "pgqueuer": run_pgqueuer,
            "procrastinate": run_procrastinate,
            "chongming-task": run_chongming,
        }.items()
        if name not in args.skip
    }
    raw = max(raw_commits(args.dsn, args.tasks) for _ in range(args.rounds))
    print(
        f"{args.tasks} durable no-op jobs, {args.workers} workers, {args.rounds} rounds "
        f"(each round runs every contender once, the order turning each round); raw "
        f"commits, one connection: {raw:,.0f}/s"
    )
    print(
        f"{'mode':10} {'contender':15} {'best/s':>7} {'each round':>20} {'vs pgq':>16} "
        f"{'median':>7} {'steady/s':>9} {'vs pgq':>7} {'commits/job':>12} {'rows/job':>9} "
        f"{'WAL B/job':>10} {'tail ms':>8}"
    )
    names = list(contenders)
    for mode in MODES:
        runs = in_rounds(
            {
                name: partial(fn, args.dsn, args.tasks, args.workers, mode)
                for name, fn in contenders.items()
            },
            args.rounds,
        )
        for name in names:
            results = runs[name]
            best = min(results, key=lambda r: r.seconds)
            rates = " ".join(f"{args.tasks / r.seconds:,.0f}" for r in results)
            ratios = [
                theirs.seconds / ours.seconds
                for ours, theirs in zip(results, runs["pgqueuer"], strict=True)
            ]
            each = " ".join(f"{ratio:.2f}" for ratio in ratios)
            steady = [r.steady for r in results]
            steady_ratios = [
                ours.steady / theirs.steady
                for ours, theirs in zip(results, runs["pgqueuer"], strict=True)
            ]
            print(
                f"{mode:10} {name:15} {args.tasks / best.seconds:7,.0f} {rates:>20} "
                f"{each:>16} {statistics.median(ratios):6.2f}x {statistics.median(steady):9,.0f} "
                f"{statistics.median(steady_ratios):6.2f}x {best.commits:12.2f} "
                f"{best.rows:9.2f} {best.wal_bytes:10,.0f} {best.tail * 1000:8.1f}"
            )
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
