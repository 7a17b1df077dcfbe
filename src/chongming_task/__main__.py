"""``python -m chongming_task``: the command line."""

from .cli import run

__all__: list[str] = []  # a script, not a module to import from

run()
