"""PostgreSQL outage recovery: how long the store stays unusable after the server returns,
and how long a call takes while it is away.

    uv run python bench/outage.py [--outages 7,22,42]

Starts a throwaway cluster of its own (``initdb`` + ``pg_ctl`` in a temp dir on a free
port; never the server you run), then for each outage length: stops the server, keeps
calling ``get`` every 50 ms, starts the server again, and measures the time from the
server accepting connections until a call succeeds. The reference, in the same run and
the same outage, is a bare ``psycopg_pool.ConnectionPool`` with the same settings (what
``PostgresTaskStore`` used before it failed fast and swapped in a fresh pool): its own
reconnect back-off decides when it is usable again.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.pg_cluster import ThrowawayCluster, _bindir  # noqa: E402

from chongming_task.stores.postgres import PostgresTaskStore  # noqa: E402


class Prober:
    """Calls ``call`` every 50 ms on a thread; records each call's duration and outcome."""

    def __init__(self, call: object) -> None:
        self.call = call
        self.samples: list[tuple[float, float, bool]] = []  # (started, took, ok)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.call()  # type: ignore[operator]
                ok = True
            except Exception:
                ok = False
            self.samples.append((started, time.monotonic() - started, ok))
            self.stop.wait(0.05)

    def first_ok_after(self, moment: float) -> float:
        for started, took, ok in self.samples:
            if ok and started + took >= moment:
                return started + took - moment
        return float("nan")

    def calls_between(self, start: float, end: float) -> list[float]:
        return [took for started, took, _ in self.samples if start <= started < end]


def main() -> int:
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)  # the pools log each refusal
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outages", default="7,22,42", help="outage lengths in seconds")
    a = p.parse_args()
    bindir = _bindir()
    if bindir is None:
        print("initdb/pg_ctl not found: install PostgreSQL's server binaries")
        return 2
    from psycopg_pool import ConnectionPool

    cluster = ThrowawayCluster(bindir)
    rows = []
    try:
        cluster.init()
        cluster.start()
        for seconds in [float(s) for s in a.outages.split(",")]:
            store = PostgresTaskStore(cluster.dsn, connect_timeout=5)
            store.create_schema()
            pool = ConnectionPool(
                cluster.dsn,
                min_size=1,
                max_size=10,
                kwargs={"connect_timeout": 5},
                check=ConnectionPool.check_connection,
                timeout=5,
                open=False,
            )
            pool.open(wait=True, timeout=5)

            def pool_call(pool: ConnectionPool = pool) -> None:
                with pool.connection() as conn:
                    conn.execute("SELECT 1")

            probes = {
                "PostgresTaskStore": Prober(lambda store=store: store.get("x")),
                "ConnectionPool (reference)": Prober(pool_call),
            }
            for probe in probes.values():
                probe.thread.start()
            time.sleep(0.5)
            cluster.stop()
            down = time.monotonic()
            time.sleep(seconds)
            cluster.start()
            back = time.monotonic()
            # Until both are usable again (or a minute has passed).
            while time.monotonic() - back < 60 and any(
                probe.first_ok_after(back) != probe.first_ok_after(back)  # NaN: not yet
                for probe in probes.values()
            ):
                time.sleep(0.2)
            for probe in probes.values():
                probe.stop.set()
                probe.thread.join(30)
            for name, probe in probes.items():
                during = probe.calls_between(down + 6, back)  # after the first detection
                rows.append(
                    (
                        seconds,
                        name,
                        probe.first_ok_after(back),
                        statistics.median(during) if during else float("nan"),
                        max(during) if during else float("nan"),
                    )
                )
            store.close()
            pool.close()
    finally:
        cluster.remove()
    print(
        f"{'outage':>7}  {'contender':28} {'unusable after return':>22} {'call during: p50':>17}"
        f" {'max':>7}"
    )
    for seconds, name, dead, median, worst in rows:
        shown = f"{dead:21.2f}s" if dead == dead else f"{'> 60':>21}s"
        calls = f"{median * 1000:15.1f}ms {worst * 1000:6.0f}ms" if median == median else ""
        print(f"{seconds:6.0f}s  {name:28} {shown} {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
