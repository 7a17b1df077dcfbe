"""The dashboard's Starlette application: pages rendered by Jinja2 (autoescaped), live
parts refreshed by htmx polling a fragment, controls posted as forms.

Access (``_access``): a request must name a host the dashboard answers to, a control
must come from the dashboard's own origin, and with a token every request must carry it
(``Authorization: Bearer``, or once as ``?token=`` which sets a cookie), wrong guesses
slowed; ``--read-only`` refuses every control. Forms carry a CSRF value that must equal
the ``cm_csrf`` cookie (double submit, ``SameSite=Strict``). Every answer forbids framing
and runs only the dashboard's own scripts. Bad input (an unknown id, a status that does
not exist, a bucket out of range, text no store holds) is a one-line 4xx page and
changes nothing; no request reads more than a page of tasks, nor any task's result
beyond what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
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
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import ChongmingTaskError, InvalidValue, StoreError
from ..lookup import (
    AmbiguousId,
    find_pipeline_run,
    find_task,
    holds_of,
    read_briefly,
    with_held,
)
from ..model import CommandAction, TaskQuery, TaskSnapshot, TaskStatus
from ..policies import format_buckets
from ..states import NON_TERMINAL, TERMINAL
from ..stores.roles import Previewed
from ..values import check_text
from . import views
from .access import SECURITY_HEADERS, same_origin
from .dashboard import Dashboard
from .metrics import metrics_text

__all__ = ["create_app"]

log = logging.getLogger("chongming_task.web")

CSRF_COOKIE = "cm_csrf"
TOKEN_COOKIE = "cm_token"
PAGE = 50
"""Tasks per page of the tasks list."""
MATCHING_AT_ONCE = 1000
"""The most tasks "act on all matching" controls at once (more: narrow the filter)."""
PAGING = ("until", "before")
"""The next page's key: the last task shown, by its creation time and id."""
EVENT_POLL = 0.05
"""Seconds between two looks of an event stream at the follower's version."""
MAX_PARAMETER = 1000
"""Characters of one query parameter or form field read (a filter longer than any name
the store holds matches nothing anyway)."""
_HEX = re.compile(r"[0-9a-f]+")


class BadInput(ValueError):
    """A query string or form the dashboard cannot honour: a 400 page, nothing done."""


def _templates() -> Jinja2Templates:
    folder = resources.files(__package__).joinpath("templates")
    templates = Jinja2Templates(directory=str(folder))
    templates.env.globals.update(
        age=views.age,
        short=views.short,
        style=views.status_style,
        ts=views.clock,
        status_text=views.status_text,
    )
    templates.env.filters["buckets"] = format_buckets
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
        return page(request, "overview.html", views.overview(d))

    def overview_live(request: Request) -> Response:
        return page(request, "_overview_live.html", views.overview(d))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        d.follower.start()
        try:
            yield
        finally:
            d.follower.stop()

    def tasks(request: Request) -> Response:
        query, shown = _task_query(d, request.query_params.multi_items())
        now = d.now()  # once: on PostgreSQL it is a round trip
        # Keyset paging: one page and one more row, whatever page it is.
        found = d.store.query(replace(query, limit=PAGE + 1))
        if query.after is None:  # the first page: with the tasks a pause holds, if asked
            found = with_held(d.caps, replace(query, limit=PAGE + 1), found)
        listed = found[:PAGE]
        # The filter without its page key: what "Older" and "all matching" carry on.
        params = [(k, v) for k, v in request.query_params.multi_items() if k not in PAGING]
        older = None
        if len(found) > PAGE:
            last = listed[-1]
            older = urlencode(
                [*params, ("until", last.created_at.isoformat()), ("before", last.task_id)]
            )
        matching = None
        counted: list[str] = []
        if not d.read_only and query.after is None and listed:  # the first page of a filter
            # The page's own read holds the whole match unless there is an older page.
            whole = (
                found
                if older is None
                else d.store.query(replace(query, limit=MATCHING_AT_ONCE + 1))
            )
            matching = len(whole)
            # The question names what it counted: "act on all" acts on those alone.
            counted = [s.task_id for s in whole] if matching <= MATCHING_AT_ONCE else []
        return page(
            request,
            "tasks.html",
            {
                "now": now,
                "tasks": listed,
                "matching": matching,
                "matching_at_once": MATCHING_AT_ONCE,
                # What the question counted: tasks made after it are left alone.
                "counted_ids": json.dumps(counted),
                "filter_query": urlencode(params),
                "older": older,
                "filters": shown,
                "statuses": [s.value for s in TaskStatus],
                "health": {s.task_id: views.health(s, now) for s in listed},
                "held": holds_of(d.caps, listed),
            },
        )

    def previewed(task_id: str) -> Previewed:
        """The task read for its page: a large result's preview, never the result."""
        found = d.caps.get_previewed(task_id)
        if found is None:
            raise LookupError(f"no task {task_id} in {d.where}")
        return found

    def task(request: Request) -> Response:
        given = _path_id(d, request)
        task_id = find_task(d.store, given, d.where, brief=True).task_id
        if task_id != given:
            return RedirectResponse(f"/tasks/{task_id}", status_code=303)
        return page(request, "task.html", views.task(d, previewed(task_id)))

    def task_live(request: Request) -> Response:
        task_id = find_task(d.store, _path_id(d, request), d.where, brief=True).task_id
        return page(request, "_task_live.html", views.task(d, previewed(task_id)))

    def task_result(request: Request) -> Response:
        """A finished task's whole result, as the store holds it (JSON), sent as it is
        read: the text is never decoded here."""
        snapshot = find_task(d.store, _path_id(d, request), d.where, brief=True)
        if snapshot.status is not TaskStatus.SUCCEEDED:
            raise LookupError(f"task {snapshot.task_id} has no result: it is {snapshot.status}")
        text = d.caps.result_json(snapshot.task_id)
        return StreamingResponse(
            _pieces("null" if text is None else text),
            media_type="application/json",
            headers={"Content-Disposition": f'inline; filename="{snapshot.task_id}.json"'},
        )

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
            answers.append((snapshot, views.control_outcome(receipt)))
        return answers

    async def control_form(request: Request) -> tuple[FormData, CommandAction] | Response:
        """A control's posted form and action, or the error page that refuses it
        (read-only, a missing or wrong CSRF value, no such control)."""
        if d.read_only:
            return error(request, 403, "this dashboard is read-only: controls are off")
        form = await request.form()
        if not _csrf_ok(request, _field(form, "csrf")):
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
        if len(given) > MATCHING_AT_ONCE:
            raise BadInput(f"more than {MATCHING_AT_ONCE} tasks selected (nothing sent)")
        for task_id in given:
            _checked(d, task_id, "task id")

        def act() -> list[tuple[Any, str]]:
            # Every id is resolved before any is acted on: an unknown one in a selection
            # is an error page with nothing sent.
            found = [find_task(d.store, task_id, d.where) for task_id in given]
            return send_each(found, action, f"{action.value} from the dashboard")

        answers = await run_in_threadpool(act)
        shown = "_answer.html" if request.headers.get("hx-request") else "answer.html"
        return page(request, shown, {"action": action.value, "answers": answers})

    async def control_matching(request: Request) -> Response:
        """The tasks the question on the tasks page counted (their ids, in the form)
        that the filter in the form's ``filter`` field still selects: a task made after
        the question is left alone, whatever clock its node stamped it with. Each is
        sent its own control; one task's failure is said and costs the others nothing."""
        posted = await control_form(request)
        if isinstance(posted, Response):
            return posted
        form, action = posted
        chosen = Request({"type": "http", "query_string": _field(form, "filter").encode()})
        query, _ = _task_query(d, chosen.query_params.multi_items())
        counted = _counted_ids(_field(form, "counted_ids"))

        def act() -> list[tuple[Any, str]]:
            found = [
                s
                for s in (read_briefly(d.store, task_id) for task_id in counted)
                if s is not None and query.matches(s)
            ]
            return send_each(
                found, action, f"{action.value} from the dashboard (all matching a filter)"
            )

        answers = await run_in_threadpool(act)
        return page(
            request,
            "answer.html",
            {"action": action.value, "answers": answers, "counted": len(counted)},
        )

    async def reconcile(request: Request) -> Response:
        """GET: what reconcile would mark lost (a dry run). POST (confirmed, CSRF): do it;
        reconcile judges every task again, so the answer may differ from the preview."""
        if request.method == "POST":
            if d.read_only:
                return error(request, 403, "this dashboard is read-only: controls are off")
            form = await request.form()
            if not _csrf_ok(request, _field(form, "csrf")):
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
        return page(request, "pipelines.html", views.pipelines(d))

    def pipeline(request: Request) -> Response:
        run_id = _checked(d, request.path_params["run_id"], "pipeline run id")
        return page(request, "pipeline.html", views.pipeline(d, run_id))

    def pipeline_live(request: Request) -> Response:
        run_id = _checked(d, request.path_params["run_id"], "pipeline run id")
        return page(request, "_pipeline_live.html", views.pipeline(d, run_id))

    def schedules(request: Request) -> Response:
        return page(request, "schedules.html", views.schedules(d))

    def nodes(request: Request) -> Response:
        return page(request, "nodes.html", views.nodes(d))

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
        told = not d.access.needs_token or _token_ok(request, d)
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

    def refused(request: Request) -> Response | None:
        """The answer to a request the dashboard will not serve (its host, its origin,
        its token), or ``None``."""
        host = request.headers.get("host")
        if not d.access.host_ok(host):
            return PlainTextResponse(
                f"400: this dashboard does not answer to the host {host!a}: open it by its "
                "address, or start it with --allowed-host NAME",
                status_code=400,
            )
        if request.method not in ("GET", "HEAD") and not _same_site(request):
            return PlainTextResponse(
                "403: a control must come from the dashboard's own pages", status_code=403
            )
        if not d.access.needs_token or request.url.path.startswith("/healthz"):
            return None
        client = request.client.host if request.client is not None else "-"
        given = request.query_params.get("token")
        # A strong token is looked at first: others' guesses never refuse its holder.
        right = d.access.strong and _token_right(request, d, given)
        wait = 0.0 if right else d.access.waiting(client)
        if wait > 0:
            return PlainTextResponse(
                f"429: too many wrong tokens from {client}: try again in {wait:.0f} s",
                status_code=429,
                headers={"Retry-After": str(max(1, round(wait)))},
            )
        if given is not None and d.access.token_is(given):
            # Back to the page without the token in its address; never off the dashboard
            # ("//evil.example/" is a path here, not another site).
            response: Response = RedirectResponse(_local(request.scope["path"]), status_code=303)
            response.set_cookie(
                TOKEN_COOKIE,
                given,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
        if right or _token_ok(request, d):
            return None
        if given is not None or _token_given(request):
            d.access.guessed_wrong(client)
        return HTMLResponse(
            "<h1>401</h1><p>This dashboard needs its access token: open it once as "
            "<code>/?token=…</code> or send <code>Authorization: Bearer …</code>.</p>",
            status_code=401,
        )

    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        answer = refused(request)
        if answer is None:
            request.state.csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
            answer = await _answered(request, call_next)
            if CSRF_COOKIE not in request.cookies:
                answer.set_cookie(
                    CSRF_COOKIE,
                    request.state.csrf,
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                )
        answer.headers.update(SECURITY_HEADERS)
        return answer

    async def _answered(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """The page, or the one-line error page that says why there is none."""
        try:
            return await call_next(request)
        except AmbiguousId as exc:
            return error(request, 409, str(exc), candidates=exc.candidates)
        except LookupError as exc:
            return error(request, 404, str(exc))
        except (BadInput, InvalidValue) as exc:
            return error(request, 400, str(exc))
        except StoreError as exc:
            return error(request, 503, str(exc).splitlines()[0])

    static = resources.files(__package__).joinpath("static")
    return Starlette(
        routes=[
            Route("/", overview),
            Route("/live/overview", overview_live),
            Route("/tasks", tasks),
            Route("/tasks/{task_id}", task),
            Route("/tasks/{task_id}/live", task_live),
            Route("/tasks/{task_id}/result", task_result),
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


def _local(path: str) -> str:
    """``path`` as a path of this site: one leading ``/`` (a browser reads ``//host`` and
    ``/\\host`` as another site)."""
    return "/" + path.lstrip("/\\")


def _same_site(request: Request) -> bool:
    """Whether a browser that sent this request says it came from the dashboard's own
    pages (a client that says nothing, such as curl, passes: it has no victim's cookies)."""
    fetched = request.headers.get("sec-fetch-site")
    if fetched is not None:
        return fetched in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is None or same_origin(origin, request.headers.get("host", ""))


def _counted_ids(text: str) -> list[str]:
    """The ids a question counted (a JSON list of at most ``MATCHING_AT_ONCE``);
    ``BadInput`` for anything else."""
    try:
        ids = json.loads(text) if text else None
    except ValueError:
        ids = None
    if (
        not isinstance(ids, list)
        or not ids
        or len(ids) > MATCHING_AT_ONCE
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_PARAMETER for i in ids)
    ):
        raise BadInput("the question's tasks are missing: reload the tasks page")
    return list(dict.fromkeys(ids))


def _pieces(text: str, size: int = 1 << 16) -> Iterator[bytes]:
    """``text`` as UTF-8, a slice at a time (one encoded copy of a slice, not of all)."""
    for at in range(0, len(text), size):
        yield text[at : at + size].encode("utf-8")


def _token_given(request: Request) -> bool:
    return request.headers.get("authorization", "").startswith("Bearer ") or (
        TOKEN_COOKIE in request.cookies
    )


def _token_right(request: Request, d: Dashboard, given: str | None) -> bool:
    """Whether the request carries the token, in any of the three places."""
    return (given is not None and d.access.token_is(given)) or _token_ok(request, d)


def _token_ok(request: Request, d: Dashboard) -> bool:
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer ") and d.access.token_is(header[7:]):
        return True
    return d.access.token_is(request.cookies.get(TOKEN_COOKIE))


def _csrf_ok(request: Request, given: str) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not given:
        return False
    return secrets.compare_digest(
        cookie.encode("utf-8", "surrogatepass"), given.encode("utf-8", "surrogatepass")
    )


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value[:MAX_PARAMETER] if isinstance(value, str) else ""


def _checked(d: Dashboard, text: str, what: str) -> str:
    """``text`` if the store could hold it (a filter it could not hold is a 400, never a
    store error)."""
    if len(text) > MAX_PARAMETER:
        raise BadInput(f"{what} is longer than {MAX_PARAMETER} characters")
    check_text(text, what, d.caps.value_rules)
    return text


def _path_id(d: Dashboard, request: Request) -> str:
    return _checked(d, request.path_params["task_id"], "task id")


def _time(text: str, what: str) -> datetime | None:
    """An aware ISO time, as UTC; ``None`` for nothing given. Anything else is a 400."""
    if not text:
        return None
    try:
        found = datetime.fromisoformat(text)
        if found.tzinfo is None:
            raise ValueError("no time zone")
        return found.astimezone(UTC)
    except (ValueError, OverflowError):
        raise BadInput(f"bad {what}: an ISO time with its zone, as the page wrote it") from None


def _task_query(d: Dashboard, params: list[tuple[str, str]]) -> tuple[TaskQuery, dict[str, Any]]:
    """The tasks page's filters from its query string, each checked (a bad one is a 400):
    a brief query, newest first, past the page key if one is given."""
    given: dict[str, list[str]] = {}
    for key, value in params:
        given.setdefault(key, []).append(_checked(d, value, f"parameter {key!r}"))

    def one(key: str) -> str | None:
        return next((v for v in given.get(key, []) if v), None)  # an empty field: not set

    statuses: frozenset[TaskStatus] | None = NON_TERMINAL
    wanted = [s for s in given.get("status", []) if s]  # the form's "unfinished" is ""
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
    chosen = [b.strip() for b in given.get("bucket", []) if b.strip()]
    if chosen:
        last = d.policy.num_buckets - 1
        bad = next((b for b in chosen if not (b.isascii() and b.isdigit())), None)
        if bad is not None:
            raise BadInput(f"bucket must be a whole number from 0 to {last}, not {bad!r}")
        try:
            buckets = d.policy.validate([int(b) for b in chosen])
        except ChongmingTaskError as exc:
            raise BadInput(f"bad bucket: {exc}") from None
    text = {key: one(key) for key in ("name", "tag", "pipeline", "node", "q")}
    prefix = None if text["q"] is None else text["q"].strip().lower()
    if prefix is not None and (len(prefix) < 2 or _HEX.fullmatch(prefix) is None):
        raise BadInput("search an id by 2 or more of its hex digits (0-9, a-f)")
    until, before = _time(one("until") or "", "page key (until)"), one("before")
    if (until is None) != (before is None):
        raise BadInput("bad page key: until and before go together")
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
        after=None if until is None or before is None else (until, before),
        newest_first=True,
        brief=True,
    )
    shown = {
        "status": wanted,
        **{k: v or "" for k, v in text.items()},
        "bucket": "" if buckets is None else format_buckets(buckets),
    }
    return query, shown
