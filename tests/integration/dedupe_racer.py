"""One racer of the dedupe races (``test_dedupe_race``): a node that submits, at the
given moment, a task with the given dedupe key, prints the id it got (its own task's or
the holder's) as a JSON line, and waits for that task to end."""

from __future__ import annotations

import json
import sys
import time

from chongming_task import CancellationToken, Controller
from chongming_task.stores import open_store


def main() -> None:
    where, schema, key, owner, at = sys.argv[1:6]
    store = open_store(where, schema=schema or None)
    with Controller(store, owner=owner) as node:

        @node.task(name="once")
        def once(token: CancellationToken) -> str:
            token.sleep(1.0)  # still unfinished while the others submit
            return owner

        time.sleep(max(0.0, float(at) - time.time()))
        handle = node.tasks["once"].configure(dedupe_key=key).submit()
        print(json.dumps({"task_id": handle.task_id, "mine": type(handle).__name__}), flush=True)
        handle.wait(60)
    store.close()


if __name__ == "__main__":
    main()
