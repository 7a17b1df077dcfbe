"""The process boundary under kill -9: nothing a node started outlives it, no result lands
on another task, every forced end is worded as what happened.

    uv run python bench/process_boundary.py [--kills 3] [--results 40] [--dsn DSN]

Runs on a fresh SQLite file, and also on PostgreSQL (a fresh schema, dropped afterwards)
when ``--dsn`` or ``CHONGMING_TEST_POSTGRES`` names a server. Each kill starts a node
process (``_boundary_work.node``, three worker processes) that first runs ``--results``
process tasks returning their own task ids, with one in five writing bytes that are not
a frame into its worker's stream before it returns; then a task its timeout ends and one
a stop ends, neither reaching a checkpoint (both forced: their workers are terminated);
then it leaves a worker suspended by a pause, and a task that started two children (one
in its process group, one in a session of its own), and says it is ready. The campaign
lists every process below the node, kills the node with SIGKILL, and watches them go.
Then it reads the store.

Printed per store (each "must be 0" fails the run when it is not):
  processes below a node when it was killed (the fork server, its workers, the children)
  alive 1 s after the kill                       must be 0
  the last of them gone after (the slowest kill)
  results stored on another task                 must be 0 (a task returning its own id
                                                 stored something else)
  streams broken, each ended "crashed" naming what the worker sent
  forced ends, and those not worded as what happened   must be 0
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stats import store_schema  # bench/ is on sys.path when run as a script
from chongming_task import TaskStatus
from chongming_task.model import TaskQuery
from chongming_task.stores import open_store

BENCH = Path(__file__).resolve().parent


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (read from ``/proc``: the bench runs on any tree,
    an older one's included, ``PYTHONPATH`` naming its ``src``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rfind(")") + 2 :].split()[1])
            parents.setdefault(parent, []).append(int(entry))
    found, below = [], parents.get(pid, [])
    while below:
        found += below
        below = [child for each in below for child in parents.get(each, [])]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def one_kill(where: str, schema: str, owner: str, folder: str, results: int) -> dict[str, float]:
    """Start a node, kill it once it is ready; how its processes went."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), *sys.path])}
    node = subprocess.Popen(
        [sys.executable, "-m", "_boundary_work", where, schema, owner, folder, str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its own lines on the streams it saw broken
        env=env,
        text=True,
        cwd=BENCH,
    )
    try:
        assert node.stdout is not None
        line = node.stdout.readline()
        if not line:
            raise SystemExit(f"the node of {owner} ended before it was ready")
        children = json.loads(line)["children"]
        below = descendants(node.pid)
        missing = set(children) - set(below)
        assert not missing, f"the task's children {missing} not below the node"
    finally:
        node.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        node.wait(30)
    alive_after_1s = -1
    gone = float("inf")
    while True:
        left = [pid for pid in below if _alive(pid)]
        waited = time.monotonic() - killed
        if not left and gone == float("inf"):
            gone = waited
        if alive_after_1s < 0 and waited >= 1.0:
            alive_after_1s = len(left)
        if alive_after_1s >= 0 and (not left or waited > 30):
            break
        time.sleep(0.005)
    for pid in left:  # leave no process behind the bench either
        os.kill(pid, signal.SIGKILL)
    return {"below": len(below), "alive after 1 s": alive_after_1s, "gone after": gone}


def read_store(where: str, schema: str) -> dict[str, int]:
    """Results on another task, broken streams said, forced ends and how they read."""
    store = open_store(where, schema=schema or None, create=False)
    try:
        tasks = store.query(TaskQuery())
        found = {"results": 0, "on another task": 0, "broken streams said": 0}
        found.update({"forced ends": 0, "forced ends not worded so": 0})
        for s in tasks:
            if s.name == "own" and s.status is TaskStatus.SUCCEEDED:
                found["results"] += 1
                found["on another task"] += s.outcome != s.task_id
            elif s.name == "scribble":
                message = "" if s.failure is None else s.failure.message
                found["broken streams said"] += "sent bytes that are not a frame" in message
                # A scribbler that ended otherwise stored its own id, or nothing.
                found["on another task"] += s.outcome not in (None, s.task_id)
            elif s.name in ("timed", "spin"):
                found["forced ends"] += 1
                said = " ".join(
                    [s.failure.message if s.failure else ""]
                    + [t.reason or "" for t in store.history(s.task_id)]
                )
                worded = "was terminated" in said and "stopped at a checkpoint" not in said
                found["forced ends not worded so"] += not worded
        return found
    finally:
        store.close()


def campaign(where: str, schema: str, kills: int, results: int, label: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="boundary-") as folder:
        rows = [
            one_kill(where, schema, f"node-{n}-{secrets.token_hex(2)}", folder, results)
            for n in range(kills)
        ]
    stored = read_store(where, schema)
    below = sum(int(r["below"]) for r in rows)
    alive = sum(int(r["alive after 1 s"]) for r in rows)
    slowest = max(r["gone after"] for r in rows)
    print(f"{label}: {kills} kills of a node, {below} processes below them when killed")
    print(f"  alive 1 s after the kill                  {alive}  (must be 0)")
    went = "never within 30 s" if slowest == float("inf") else f"{slowest * 1000:.0f} ms"
    print(f"  the last of them gone after               {went} (the slowest kill)")
    print(
        f"  results on another task                   {stored['on another task']}  (must be 0;"
        f" {stored['results']} results, {stored['broken streams said']} broken streams said)"
    )
    print(
        f"  forced ends not worded as what happened   {stored['forced ends not worded so']}"
        f"  (must be 0; {stored['forced ends']} forced ends)"
    )
    return (
        alive == 0 and stored["on another task"] == 0 and stored["forced ends not worded so"] == 0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--results", type=int, default=40)
    parser.add_argument("--dsn", default=os.environ.get("CHONGMING_TEST_POSTGRES"))
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="boundary-db-") as folder:
        ok &= campaign(str(Path(folder) / "b.db"), "", args.kills, args.results, "SQLite")
    if args.dsn and args.dsn != "none":
        with store_schema(args.dsn, "boundary") as schema:
            ok &= campaign(args.dsn, schema, args.kills, args.results, "PostgreSQL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
