"""The dashboard at ``/``: a server-rendered page whose live part (``/dashboard/live``) a few
lines of the package's own script fetch again every ``refresh_ms``; dead-letter actions are
plain form POSTs (session and CSRF token checked, service.auth) answered by a redirect to ``/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from producer.client import Client
from service.context import Context
from service.dashboard_view import PLOT_H, PLOT_W, read_view
from service.errors import ApiError

templates = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))
DEFAULT_REFRESH_MS = 2000
SESSION_MAX_AGE_S = 7 * 86_400


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


templates.env.filters["clock"] = _clock


def _session(request: Request) -> str:
    session = Context.of(request).auth.session(request)
    if session is None:
        raise ApiError(401, "log in first (/login) or send an API key as a bearer token")
    return session


def _refresh_ms(request: Request) -> int:
    raw = request.query_params.get("refresh_ms", "")
    return max(250, min(60_000, int(raw))) if raw.isdigit() else DEFAULT_REFRESH_MS


def _live(request: Request, session: str) -> dict[str, Any]:
    ctx = Context.of(request)
    return {
        "request": request,
        "view": read_view(ctx.redis, ctx.keys, ctx.records),
        "queue": ctx.config.queue,
        "csrf": ctx.auth.csrf_token(session),
        "plot_w": PLOT_W,
        "plot_h": PLOT_H,
    }


def page(request: Request) -> Response:
    ctx = Context.of(request)
    session = ctx.auth.session(request)
    if session is None:
        return RedirectResponse("/login", status_code=303)
    context = _live(request, session) | {"refresh_ms": _refresh_ms(request), "auth": ctx.auth.required}
    return templates.TemplateResponse(request, "dashboard.html", context)


def live(request: Request) -> Response:
    return templates.TemplateResponse(request, "live.html", _live(request, _session(request)))


async def login(request: Request) -> Response:
    ctx = Context.of(request)
    if request.method == "GET":
        return templates.TemplateResponse(request, "login.html", {"failed": False})
    form = await request.form()
    cookie = ctx.auth.login_cookie(str(form.get("api_key", "")))
    if cookie is None:
        return templates.TemplateResponse(request, "login.html", {"failed": True}, status_code=401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        "radixq_session", cookie, max_age=SESSION_MAX_AGE_S, httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


async def dead_letter_action(request: Request) -> Response:
    """Requeue or discard one dead letter (``action``), then back to the page."""
    ctx = Context.of(request)
    session = _session(request)
    form = await request.form()
    if not ctx.auth.csrf_ok(session, str(form.get("csrf", ""))):
        raise ApiError(403, "the form's CSRF token is missing or wrong: reload the page")
    action = request.path_params["action"]
    if action not in ("requeue", "discard"):
        raise ApiError(404, f"no dead-letter action {action!r}")
    queue = Client(ctx.redis, ctx.config.queue)
    if action == "requeue":
        job_id = str(form.get("job_id", ""))
        requeued = await run_in_threadpool(queue.requeue_dead, [job_id])
        ctx.log.info("dashboard: requeued dead letter %s (%d)", job_id, len(requeued))
    else:
        entry_id = request.path_params["entry_id"]
        removed = await run_in_threadpool(queue.discard_dead, [entry_id])
        ctx.log.info("dashboard: discarded dead letter entry %s (%d)", entry_id, removed)
    return RedirectResponse("/", status_code=303)


def routes() -> list[Route]:
    return [
        Route("/", page),
        Route("/dashboard/live", live),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/dashboard/dead/{entry_id}/{action:str}", dead_letter_action, methods=["POST"]),
    ]
