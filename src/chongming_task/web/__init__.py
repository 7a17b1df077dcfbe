"""The web dashboard (``chongming-task web``, the ``[web]`` extra): the fleet at a glance
and a task's controls one click away, against any store the CLI opens.

Pages: overview (counts, the bucket map with owners and alarms, nodes, alarms), tasks
(filters, id-prefix search), a task (progress, every transition, failure and traceback,
result, lease and heartbeat), schedules, nodes. ``/metrics`` (Prometheus text) and
``/healthz``. Controls go through the command channel like the CLI's, and answer exactly
what happened. Importing ``chongming_task`` never imports this package.
"""

from __future__ import annotations

from .app import create_app
from .dashboard import Dashboard

__all__ = ["Dashboard", "create_app"]
