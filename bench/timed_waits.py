"""What a thread hand-off costs on this machine, waiting with a timeout and without.

    uv run python bench/timed_waits.py [--handoffs N] [--rounds R]

Two threads pass a turn back and forth through two ``threading.Lock``s, N times: each
releases the other's lock, then blocks on its own. Once every wait is untimed
(``acquire()``), once every wait has a timeout it never reaches
(``acquire(timeout=0.5)``). The work is the same; only the timeout differs. A wait with
a timeout arms a kernel timer. On a virtual machine, arming and cancelling one can cost
an exit to the hypervisor apiece, and the runtime's threads wait that way in a few
places (a group commit's writer waiting for its writes, and the interpreter lock
itself, which CPython waits for in slices of ``sys.getswitchinterval()``). Reported per
round trip: wall time and the process's CPU time. The rounds alternate the two kinds,
and the best of each is kept.
"""

from __future__ import annotations

import argparse
import threading
import time


def round_trips(handoffs: int, timeout: float | None) -> tuple[float, float]:
    """Wall and CPU seconds of ``handoffs`` round trips between two threads."""
    mine, theirs = threading.Lock(), threading.Lock()
    mine.acquire()
    theirs.acquire()

    def wait(lock: threading.Lock) -> None:
        if timeout is None:
            lock.acquire()
        elif not lock.acquire(timeout=timeout):
            raise RuntimeError("a hand-off timed out")

    def other() -> None:
        for _ in range(handoffs):
            wait(theirs)
            mine.release()

    thread = threading.Thread(target=other)
    thread.start()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(handoffs):
        theirs.release()
        wait(mine)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    thread.join()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds: dict[str, float | None] = {"untimed": None, "with a timeout": 0.5}
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, timeout in kinds.items():
            wall, cpu = round_trips(args.handoffs, timeout)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
    print(f"{args.handoffs} round trips between two threads, best of {args.rounds} rounds")
    print(f"{'wait':16} {'wall us':>8} {'cpu us':>8}  (a round trip)")
    for name, (wall, cpu) in best.items():
        n = args.handoffs
        print(f"{name:16} {wall / n * 1e6:8.1f} {cpu / n * 1e6:8.1f}")


if __name__ == "__main__":
    main()
