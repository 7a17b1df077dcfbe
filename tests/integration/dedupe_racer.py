"""One racer of the dedupe races (``test_dedupe_race``): a node that says it is ready,
submits a task with the given dedupe key once the file ``go`` exists, prints the id it
got (its own task's or the holder's) as a JSON line, and waits for that task to end. The
task runs until the file ``release`` exists: unfinished while every racer submits, however
slowly the machine starts them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from chongming_task import CancellationToken, Controller
from chongming_task.stores import open_store


def main() -> None:
    where, schema, key, owner, folder = sys.argv[1:6]
    go, release = Path(folder) / "go", Path(folder) / "release"
    store = open_store(where, schema=schema or None)
    with Controller(store, owner=owner) as node:

        @node.task(name="once")
        def once(token: CancellationToken) -> str:
            while not release.exists():
                token.sleep(0.02)
            return owner

        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        handle = node.tasks["once"].configure(dedupe_key=key).submit()
        print(json.dumps({"task_id": handle.task_id, "mine": type(handle).__name__}), flush=True)
        handle.wait(120)
    store.close()


if __name__ == "__main__":
    main()
