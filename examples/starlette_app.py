"""A Starlette service running its business tasks on a chongming-task node: the node
lives in the app's lifespan, one endpoint submits an ``async def`` task, one pauses it,
one resumes it, one reads it.

    uv run uvicorn examples.starlette_app:app        # then:
    curl -X POST localhost:8000/reports?rows=500
    curl -X POST localhost:8000/tasks/<id>/pause
    curl localhost:8000/tasks/<id>

The task awaits its token (``acheckpoint``, ``asleep``), so a pause holds it without
blocking the event loop, and a stop or timeout really cancels it. ``CHONGMING_DB`` names
the store (default ``reports.db`` beside the working directory).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from chongming_task import CancellationToken, Controller, Progress, TaskNotFound


async def build_report(token: CancellationToken, rows: int) -> dict[str, int]:
    """The business task: a report built a hundred rows at a time."""
    done = 0
    while done < rows:
        done = min(rows, done + 100)
        await token.acheckpoint(Progress(current=done, total=rows, message="rows"))
        await token.asleep(0.05)  # the database query of the next hundred, say
    return {"rows": done}


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with Controller(os.environ.get("CHONGMING_DB", "reports.db")) as node:
        node.task(name="report", timeout=600)(build_report)
        app.state.node = node
        yield


async def submit(request: Request) -> JSONResponse:
    rows = int(request.query_params.get("rows", "1000"))
    run = await request.app.state.node.asubmit("report", rows)
    return JSONResponse({"task_id": run.task_id, "status": run.status.value}, 202)


async def pause(request: Request) -> JSONResponse:
    receipt = await request.app.state.node.apause(request.path_params["task_id"])
    return JSONResponse({"outcome": receipt.outcome.value})


async def resume(request: Request) -> JSONResponse:
    receipt = await request.app.state.node.aresume(request.path_params["task_id"])
    return JSONResponse({"outcome": receipt.outcome.value})


async def show(request: Request) -> JSONResponse:
    try:
        task = request.app.state.node.get(request.path_params["task_id"])
    except TaskNotFound as exc:
        return JSONResponse({"error": str(exc)}, 404)
    progress = None if task.progress is None else task.progress.current
    return JSONResponse({"status": task.status.value, "progress": progress, "result": task.outcome})


app = Starlette(
    routes=[
        Route("/reports", submit, methods=["POST"]),
        Route("/tasks/{task_id}/pause", pause, methods=["POST"]),
        Route("/tasks/{task_id}/resume", resume, methods=["POST"]),
        Route("/tasks/{task_id}", show),
    ],
    lifespan=lifespan,
)
