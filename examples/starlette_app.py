"""A Starlette service running its business tasks on a chongming-task node: the node
lives in the app's lifespan, one endpoint submits an ``async def`` task, one pauses it,
one resumes it, one reads it.

    uv run uvicorn examples.starlette_app:app        # then, within its 20 s:
    curl -X POST 'localhost:8000/reports?rows=10000'
    curl -X POST localhost:8000/tasks/<id>/pause
    curl localhost:8000/tasks/<id>                  # paused: its progress stands still
    curl -X POST localhost:8000/tasks/<id>/resume

The task awaits its token (``acheckpoint``, ``asleep``), so a pause holds it without
blocking the event loop, and a stop or timeout really cancels it. ``CHONGMING_DB`` names
the store (default ``reports.db`` beside the working directory). A bad ``rows`` is a 400
and an unknown task a 404, each with one line saying why. Stopping the server (Ctrl-C,
or a deploy's SIGTERM) drains the node: running reports may finish first.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import chongming_task
from chongming_task import CancellationToken, Controller, Progress

MAX_ROWS = 1_000_000


@chongming_task.task(name="report", timeout=600)  # a task of no node yet: the app's registers it
async def build_report(token: CancellationToken, rows: int) -> dict[str, int]:
    """The business task: a report built a hundred rows at a time, 0.2 s each."""
    done = 0
    while done < rows:
        done = min(rows, done + 100)
        await token.acheckpoint(Progress(current=done, total=rows, message="rows"))
        await token.asleep(0.2)  # the database query of the next hundred, say
    return {"rows": done}


DRAIN = 30.0  # seconds a deploy gives the running reports to finish


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    node = Controller(os.environ.get("CHONGMING_DB", "reports.db"))
    try:
        node.register(build_report)
        app.state.node = node
        yield
    finally:
        # A deploy's SIGTERM: the server stops taking requests, then this runs. The node
        # takes no new report and lets the running ones finish for up to DRAIN seconds;
        # what still runs then is stopped at its next checkpoint, saying so.
        await node.aclose(drain=DRAIN)


async def submit(request: Request) -> JSONResponse:
    given = request.query_params.get("rows", "1000")
    if not given.isascii() or not given.isdigit() or not 0 < int(given) <= MAX_ROWS:
        return JSONResponse({"error": f"rows must be a whole number from 1 to {MAX_ROWS}"}, 400)
    run = await build_report.asubmit(int(given))
    return JSONResponse({"task_id": run.task_id, "status": run.status.value}, 202)


async def pause(request: Request) -> JSONResponse:
    try:
        receipt = await request.app.state.node.apause(request.path_params["task_id"])
    except LookupError as exc:  # TaskNotFound: no such task
        return JSONResponse({"error": str(exc)}, 404)
    return JSONResponse({"outcome": receipt.outcome.value})


async def resume(request: Request) -> JSONResponse:
    try:
        receipt = await request.app.state.node.aresume(request.path_params["task_id"])
    except LookupError as exc:
        return JSONResponse({"error": str(exc)}, 404)
    return JSONResponse({"outcome": receipt.outcome.value})


async def show(request: Request) -> JSONResponse:
    try:
        task = request.app.state.node.get(request.path_params["task_id"])
    except LookupError as exc:
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
