"""The dashboard's Starlette application: pages rendered by Jinja2 (autoescaped), live
parts refreshed by htmx polling a fragment, controls posted as forms.

Access: with a token, every request must carry it (``Authorization: Bearer``, or once as
``?token=`` which sets a cookie); ``--read-only`` refuses every control. Forms carry a
CSRF value that must equal the ``cm_csrf`` cookie (double submit, ``SameSite=Strict``), so
another site cannot post one. Bad input (an unknown id, a status that does not exist, a
bucket out of range) is a clear error page and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .._lookup import AmbiguousId, find_pipeline_run, find_task
from ..errors import ChongmingTaskError, InvalidValue
from ..model import CommandAction, TaskQuery, TaskSnapshot, TaskStatus
from ..policies import format_buckets
from ..states import NON_TERMINAL, TERMINAL
from . import _views
from ._dashboard import Dashboard
from ._metrics import metrics_text

__all__ = ["create_app"]

CSRF_COOKIE = "cm_csrf"
TOKEN_COOKIE = "cm_token"
PAGE = 50
"""Tasks per page of the tasks list."""
MATCHING_AT_ONCE = 1000
"""The most tasks "act on all matching" controls at once (more: narrow the filter)."""
PAGING = ("until", "skip")
EVENT_POLL = 0.05
"""Seconds between two looks of an event stream at the follower's version."""
MAX_SKIP = 100_000
"""Tasks created at one same instant that paging steps over (a bulk submit's batch)."""


class BadInput(ValueError):
    """A query string or form the dashboard cannot honour: a 400 page, nothing done."""


def _templates() -> Jinja2Templates:
    folder = resources.files(__package__).joinpath("templates")
    templates = Jinja2Templates(directory=str(folder))
    templates.env.globals.update(
        age=_views.age,
        short=_views.short,
        style=_views.status_style,
        ts=_views.clock,
        status_text=_views.status_text,
    )
    return templates


def create_app(dashboard: Dashboard) -> Starlette:
    """The dashboard as an ASGI application (``uvicorn`` serves it in ``web``)."""
    templates = _templates()
    d = dashboard

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        base = {
            "where": d.where,
            "read_only": d.read_only,
            "csrf": request.state.csrf,
            # Where the page's live part is fetched again from (hx-select picks it).
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        if "now" not in context:  # a view that read the store's clock passes its reading
            base["now"] = d.now()
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)

    def error(request: Request, status: int, message: str, **more: Any) -> Response:
        return page(request, "error.html", {"status": status, "message": message, **more}, status)

    def overview(request: Request) -> Response:
        return page(request, "overview.html", _views.overview(d))

    def overview_live(request: Request) -> Response:
        return page(request, "_overview_live.html", _views.overview(d))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        d.follower.start()
        try:
            yield
        finally:
            d.follower.stop()

    def tasks(request: Request) -> Response:
        query, shown, skip = _task_query(d, request)
        now = d.now()  # once: on PostgreSQL it is a round trip
        found = d.store.query(query)[skip:]
        listed = found[:PAGE]
        older = None
        if len(found) > PAGE:
            # Keyset paging: the next page starts at the last time shown, past the tasks
            # of that very time already shown (a tie; they come first, newest first).
            last = listed[-1].created_at
            tied = sum(1 for s in listed if s.created_at == last)
            if query.created_until == last:
                tied += skip
            params = [(k, v) for k, v in request.query_params.multi_items() if k not in PAGING]
            older = urlencode([*params, ("until", last.isoformat()), ("skip", str(tied))])
        matching = None
        if not d.read_only and not query.created_until:  # the first page of a filter
            # The page's own read holds the whole match unless there is an older page.
            matching = (
                len(found)
                if older is None
                else len(d.store.query(replace(query, limit=MATCHING_AT_ONCE + 1)))
            )
        return page(
            request,
            "tasks.html",
            {
                "now": now,
                "tasks": listed,
                "matching": matching,
                "matching_at_once": MATCHING_AT_ONCE,
                "filter_query": request.url.query,
                "older": older,
                "filters": shown,
                "statuses": [s.value for s in TaskStatus],
                "health": {s.task_id: _views.health(s, now) for s in listed},
            },
        )

    def task(request: Request) -> Response:
        snapshot = find_task(d.store, request.path_params["task_id"], d.where)
        if snapshot.task_id != request.path_params["task_id"]:
            return RedirectResponse(f"/tasks/{snapshot.task_id}", status_code=303)
        return page(request, "task.html", _views.task(d, snapshot))

    def task_live(request: Request) -> Response:
        snapshot = find_task(d.store, request.path_params["task_id"], d.where)
        return page(request, "_task_live.html", _views.task(d, snapshot))

    def send_each(
        found: list[TaskSnapshot], action: CommandAction, reason: str
    ) -> list[tuple[TaskSnapshot, str]]:
        """Each task its own control; one that fails is said, the others still go."""
        answers = []
        for snapshot in found:
            try:
                receipt = d.control.send(snapshot.task_id, action, reason)
            except ChongmingTaskError as exc:
                answers.append((snapshot, f"failed: {exc}"))
                continue
            answers.append((snapshot, _views.control_outcome(receipt)))
        return answers

    async def control_form(request: Request) -> tuple[FormData, CommandAction] | Response:
        """A control's posted form and action, or the error page that refuses it
        (read-only, a missing or wrong CSRF value, no such control)."""
        if d.read_only:
            return error(request, 403, "this dashboard is read-only: controls are off")
        form = await request.form()
        if not _csrf_ok(request, str(form.get("csrf", ""))):
            return error(request, 403, "the form's CSRF value is missing or wrong; reload the page")
        try:
            return form, CommandAction(request.path_params["action"])
        except ValueError:
            return error(request, 404, f"no control named {request.path_params['action']!r}")

    async def control(request: Request) -> Response:
        posted = await control_form(request)
        if isinstance(posted, Response):
            return posted
        form, action = posted
        given = [str(v) for v in form.getlist("task_id")] or [request.path_params["task_id"]]

        def act() -> list[tuple[Any, str]]:
            # Every id is resolved before any is acted on: an unknown one in a selection
            # is an error page with nothing sent.
            found = [find_task(d.store, task_id, d.where) for task_id in given]
            return send_each(found, action, f"{action.value} from the dashboard")

        answers = await run_in_threadpool(act)
        shown = "_answer.html" if request.headers.get("hx-request") else "answer.html"
        return page(request, shown, {"action": action.value, "answers": answers})

    async def control_matching(request: Request) -> Response:
        """Every task the filter in the form's ``filter`` field selects (as the tasks
        page read it), each sent its own control; one task's failure is said and costs
        the others nothing."""
        posted = await control_form(request)
        if isinstance(posted, Response):
            return posted
        form, action = posted
        chosen = Request({"type": "http", "query_string": str(form.get("filter", "")).encode()})
        query = replace(_task_query(d, chosen)[0], limit=MATCHING_AT_ONCE + 1, created_until=None)

        def act() -> list[tuple[Any, str]]:
            found = d.store.query(query)
            if len(found) > MATCHING_AT_ONCE:
                raise BadInput(
                    f"more than {MATCHING_AT_ONCE} tasks match: narrow the filter (nothing sent)"
                )
            return send_each(
                found, action, f"{action.value} from the dashboard (all matching a filter)"
            )

        answers = await run_in_threadpool(act)
        return page(request, "answer.html", {"action": action.value, "answers": answers})

    async def reconcile(request: Request) -> Response:
        """GET: what reconcile would mark lost (a dry run). POST (confirmed, CSRF): do it;
        reconcile judges every task again, so the answer may differ from the preview."""
        if request.method == "POST":
            if d.read_only:
                return error(request, 403, "this dashboard is read-only: controls are off")
            form = await request.form()
            if not _csrf_ok(request, str(form.get("csrf", ""))):
                return error(request, 403, "the form's CSRF value is missing or wrong")

        def run() -> tuple[Any, list[Any]]:
            controller = d.controller()
            try:
                report = controller.reconcile(dry_run=request.method != "POST")
            finally:
                controller.close()
            return report, [d.store.get(task_id) for task_id in report.lost[:200]]

        report, found = await run_in_threadpool(run)
        return page(
            request,
            "reconcile.html",
            {"report": report, "tasks": [s for s in found if s is not None]},
        )

    def pipelines(request: Request) -> Response:
        return page(request, "pipelines.html", _views.pipelines(d))

    def pipeline(request: Request) -> Response:
        return page(request, "pipeline.html", _views.pipeline(d, request.path_params["run_id"]))

    def pipeline_live(request: Request) -> Response:
        found = _views.pipeline(d, request.path_params["run_id"])
        return page(request, "_pipeline_live.html", found)

    def schedules(request: Request) -> Response:
        return page(request, "schedules.html", _views.schedules(d))

    def nodes(request: Request) -> Response:
        return page(request, "nodes.html", _views.nodes(d))

    async def events(request: Request) -> Response:
        """Server-sent events: ``change`` when the follower saw a transition or a progress
        move (open pages then fetch their live part; they also poll every 5 s), and a
        comment every 15 s so that proxies keep the stream."""

        async def stream() -> AsyncIterator[str]:
            seen, quiet = d.follower.version, 0.0
            yield "retry: 2000\n\n"
            while not (d.follower.stopped or d.closing()):
                await asyncio.sleep(EVENT_POLL)
                if d.follower.version != seen:
                    seen, quiet = d.follower.version, 0.0
                    yield f"event: change\ndata: {seen}\n\n"
                else:
                    quiet += EVENT_POLL
                    if quiet >= 15:
                        quiet = 0.0
                        yield ": still here\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def healthz(request: Request) -> Response:
        """One point read: the store answers (cheap enough for a probe every second).
        The one page a dashboard with an access token serves to anyone: to a caller
        without the token it says only that, no path, no figures (a dashboard without a
        token shows every page to whoever reaches it)."""
        told = d.token is None or _token_ok(request, d.token)
        try:
            d.store.get("healthz")
        except ChongmingTaskError as exc:
            return JSONResponse(
                {"ok": False, "store": d.where, "error": str(exc)} if told else {"ok": False},
                503,
            )
        if not told:
            return JSONResponse({"ok": True})
        figures = d.follower.latest()
        # The dashboard is fine; the nodes say how they are (store writes, threads).
        sick = [
            {"node": n.record.node, "problems": n.record.health.problems()}
            for n in figures.report.nodes
            if n.live and n.record.health is not None and not n.record.health.healthy
        ]
        return JSONResponse(
            {
                "ok": True,
                "store": d.where,
                "tasks": sum(figures.counts.values()),
                "figures_age": round(max(0.0, (d.now() - figures.at).total_seconds()), 3),
                "nodes_healthy": not sick,
                "unhealthy_nodes": sick,
            }
        )

    def metrics(request: Request) -> Response:
        body, content_type = metrics_text(d.registry)
        return Response(body, media_type=content_type)

    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if d.token is not None and not request.url.path.startswith("/healthz"):
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given, d.token):
                response: Response = RedirectResponse(request.url.path, status_code=303)
                response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
                return response
            if not _token_ok(request, d.token):
                return HTMLResponse(
                    "<h1>401</h1><p>This dashboard needs its access token: open it once as "
                    "<code>/?token=…</code> or send <code>Authorization: Bearer …</code>.</p>",
                    status_code=401,
                )
        request.state.csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        try:
            response = await call_next(request)
        except AmbiguousId as exc:
            response = error(request, 409, str(exc), candidates=exc.candidates)
        except LookupError as exc:
            response = error(request, 404, str(exc))
        except (BadInput, InvalidValue) as exc:
            response = error(request, 400, str(exc))
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, request.state.csrf, httponly=True, samesite="strict")
        return response

    static = resources.files(__package__).joinpath("static")
    return Starlette(
        routes=[
            Route("/", overview),
            Route("/live/overview", overview_live),
            Route("/tasks", tasks),
            Route("/tasks/{task_id}", task),
            Route("/tasks/{task_id}/live", task_live),
            Route("/tasks/matching/{action}", control_matching, methods=["POST"]),
            Route("/tasks/{task_id}/{action}", control, methods=["POST"]),
            Route("/reconcile", reconcile, methods=["GET", "POST"]),
            Route("/pipelines", pipelines),
            Route("/pipelines/{run_id}", pipeline),
            Route("/pipelines/{run_id}/live", pipeline_live),
            Route("/schedules", schedules),
            Route("/nodes", nodes),
            Route("/healthz", healthz),
            Route("/favicon.ico", lambda _: RedirectResponse("/static/favicon.svg", 301)),
            Route("/events", events),
            Route("/metrics", metrics),
            Mount("/static", StaticFiles(directory=str(static)), name="static"),
        ],
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)],
        lifespan=lifespan,
    )


def _token_ok(request: Request, token: str) -> bool:
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer ") and hmac.compare_digest(header[7:], token):
        return True
    cookie = request.cookies.get(TOKEN_COOKIE)
    return cookie is not None and hmac.compare_digest(cookie, token)


def _csrf_ok(request: Request, given: str) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    return bool(cookie) and bool(given) and hmac.compare_digest(cookie or "", given)


def _task_query(d: Dashboard, request: Request) -> tuple[TaskQuery, dict[str, Any], int]:
    """The tasks page's filters from its query string, each checked (a bad one is a 400)."""
    q = request.query_params
    statuses: frozenset[TaskStatus] | None = NON_TERMINAL
    wanted = q.getlist("status")
    if wanted == ["all"]:
        statuses = None
    elif wanted == ["finished"]:
        statuses = TERMINAL
    elif wanted:
        try:
            statuses = frozenset(TaskStatus(s) for s in wanted)
        except ValueError:
            raise BadInput(f"unknown status in {wanted}") from None
    buckets: frozenset[int] | None = None
    if q.get("bucket"):
        given = q.getlist("bucket")
        last = d.policy.num_buckets - 1
        bad = next((b for b in given if not b.strip().isdigit()), None)
        if bad is not None:
            raise BadInput(f"bucket must be a whole number from 0 to {last}, not {bad!r}")
        try:
            buckets = d.policy.validate([int(b) for b in given])
        except ChongmingTaskError as exc:
            raise BadInput(f"bad bucket: {exc}") from None
    text = {key: (q.get(key) or None) for key in ("name", "tag", "pipeline", "node", "q")}
    prefix = None if text["q"] is None else text["q"].lower()  # ids are lower-case hex
    if prefix is not None and len(prefix) < 2:
        raise BadInput("search an id by at least 2 characters")
    until, skip = None, 0
    if q.get("until"):
        try:
            until = datetime.fromisoformat(q["until"])
            skip = int(q.get("skip", "0"))
        except ValueError:
            raise BadInput("bad page cursor (until, skip)") from None
        if until.tzinfo is None or not 0 <= skip <= MAX_SKIP:
            raise BadInput("bad page cursor (until, skip)")
    pipeline = text["pipeline"]
    if pipeline is not None:  # its id or a unique prefix of 6+ characters, as in the CLI
        pipeline = find_pipeline_run(d.store, pipeline) or pipeline
    query = TaskQuery(
        statuses=statuses,
        id_prefix=prefix,
        name_glob=text["name"],  # as the CLI: a glob, an exact name without wildcards
        tag=text["tag"],
        buckets=buckets,
        pipeline_run_id=pipeline,
        owner=text["node"],
        created_until=until,
        limit=skip + PAGE + 1,
        newest_first=True,
    )
    shown = {
        "status": wanted,
        **{k: v or "" for k, v in text.items()},
        "bucket": "" if buckets is None else format_buckets(buckets),
    }
    return query, shown, skip
