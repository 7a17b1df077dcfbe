"""``python -m chongming_task``: the command line."""

from .cli import run

run()
