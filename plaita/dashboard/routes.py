"""The dashboard's pages (GET) and actions (POST).

Reads of the overview come from the sampler's picture in memory; the DLQ pages read Redis
when asked. Every action goes through ``Guard.check_action`` first, runs its Redis calls in
a worker thread, and redirects to the page it came from with a notice (post/redirect/get),
so reloading a page never repeats an action. A Redis failure is a message, never a crash.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from plaita.dashboard import actions, dlq_view, executions, lineage
from plaita.dashboard.actions import ActionError, Outcome
from plaita.dashboard.core import Dashboard
from plaita.dashboard.security import SESSION_COOKIE, Forbidden
from plaita.store.errors import is_redis_failure
from plaita.store.executions.store import UnreadableExecution

T = TypeVar("T")


def _redis_text(dash: Dashboard, exc: Exception) -> str:
    return str(dash.scrub(f"Redis at {dash.redis_label} failed: {type(exc).__name__}: {exc}"))


async def _read(dash: Dashboard, call: Callable[[], T]) -> tuple[T | None, str | None]:
    """(result, None), or (None, message) when Redis failed."""
    try:
        return await run_in_threadpool(call), None
    except Exception as exc:
        if not is_redis_failure(exc):
            raise
        return None, _redis_text(dash, exc)


async def _form(request: Request) -> dict[str, Any]:
    form = await request.form()
    return {k: form.getlist(k) if k == "id" else str(form.get(k) or "") for k in form}


class Views:
    """The route handlers, bound to one Dashboard."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    async def overview(self, request: Request) -> Response:
        return self.dash.render(request, "overview.html", active="overview")

    async def overview_fragment(self, request: Request) -> Response:
        return self.dash.render(request, "_live.html")

    async def overview_json(self, _request: Request) -> Response:
        return JSONResponse(self.dash.monitor.snapshot())

    async def workers(self, request: Request) -> Response:
        return self.dash.render(request, "workers.html", active="workers")

    async def dlq(self, request: Request) -> Response:
        needle = request.query_params.get("q", "").strip()[:200]
        after = request.query_params.get("after", "").strip()[:40]
        try:
            found, error = await _read(self.dash, lambda: dlq_view.page(self.dash.page_dlq, needle, after))
        except ActionError as exc:
            found, error = None, str(exc)
        length, _ = await _read(self.dash, self.dash.page_dlq.length)
        return self.dash.render(
            request, "dlq.html", active="dlq", found=found, rows=found.rows if found else [], q=needle, after=after,
            length=length, page_error=error, scan_entries=dlq_view.SCAN_ENTRIES,
        )  # fmt: skip

    async def dlq_entry(self, request: Request) -> Response:
        dlq_id = request.path_params["dlq_id"]
        if not actions.STREAM_ID.fullmatch(dlq_id):
            return self.dash.render(request, "message.html", 404, active="dlq", title="Not a DLQ id", text=dlq_id)
        row, error = await _read(self.dash, lambda: self.dash.page_dlq.get(dlq_id))
        if row is None and error is None:
            return self.dash.render(
                request, "message.html", 404, active="dlq", title="No such dead letter", text=dlq_id
            )
        pretty = json.dumps(row, indent=2, sort_keys=True, ensure_ascii=False, default=str) if row else ""
        return self.dash.render(request, "dlq_entry.html", active="dlq", row=row, pretty=pretty, page_error=error)

    async def execution_list(self, request: Request) -> Response:
        status = request.query_params.get("status", "").strip()[:40]
        flow = request.query_params.get("flow", "").strip()[:200]
        waiting = request.query_params.get("waiting", "").strip()[:40]
        tenant = request.query_params.get("tenant", "").strip()[:200]
        store = self.dash.page_executions

        def read() -> tuple[list[dict[str, Any]], dict[str, int] | None]:
            rows = executions.listing(store, status, flow, waiting=waiting, tenant=tenant)
            # The filter's counts, read with the rows from the same tenant's index; none under a
            # flow filter (the index counts every flow, and a count beside a filter must be its own).
            return rows, None if flow else executions.tenant_store(store, tenant).counts()

        try:
            found, error = await _read(self.dash, read)
        except ActionError as exc:
            found, error = None, str(exc)
        rows, counts = found or ([], None)
        return self.dash.render(
            request, "executions.html", active="executions", rows=rows, groups=executions.grouped(rows),
            counts=counts, child_links=executions.CHILD_LINKS, status=status, flow=flow,
            waiting=waiting, waiting_kinds=executions.WAITING_KINDS, waiting_for=lineage.waiting_for, tenant=tenant,
            statuses=executions.STATUSES, limit=executions.LIST_ROWS, page_error=error,
        )  # fmt: skip

    async def execution_page(self, request: Request) -> Response:
        eid = request.path_params["execution_id"]
        if not executions.valid_id(eid):
            return self.dash.render(request, "message.html", 404, active="executions", title="Not an id", text=eid)
        spawn = request.query_params.get("spawn", "")[: executions.MAX_ID_CHARS + 100]
        offset = max(0, _int(request.query_params.get("children_from", "0")))
        tenant = request.query_params.get("tenant", "").strip()[:200]
        try:
            store = executions.tenant_store(self.dash.page_executions, tenant)
        except ActionError as exc:
            text = str(exc)
            return self.dash.render(request, "message.html", 404, active="executions", title="Not a tenant", text=text)

        def read() -> tuple[dict[str, Any] | None, dict[str, Any]]:
            try:
                doc = store.get(eid)
            except UnreadableExecution as exc:  # data, not an outage: say what the key holds
                return None, {"unreadable": str(exc)}
            return doc, lineage.view(store, doc, spawn, offset) if doc else {}

        found, error = await _read(self.dash, read)
        doc, composed = found or (None, {})
        if "unreadable" in composed:
            text = str(composed["unreadable"])
            return self.dash.render(
                request, "message.html", active="executions", title="Unreadable execution", text=text
            )
        if doc is None and error is None:
            return self.dash.render(
                request, "message.html", 404, active="executions", title="No such execution", text=eid
            )
        return self.dash.render(
            request, "execution.html", active="executions", doc=doc, eid=eid, page_error=error, tenant=tenant,
            steps=executions.timeline(doc) if doc else [], pretty=executions.pretty, terminal=executions.TERMINAL,
            resume_types=executions.RESUME_TYPES, resume_id=secrets.token_hex(8), composed=composed,
            fork_steps=executions.fork_steps(doc) if doc else [],
            limit_children=lineage.CHILD_ROWS,
        )  # fmt: skip

    async def schedules(self, request: Request) -> Response:
        rows, error = await _read(self.dash, lambda: lineage.schedules(self.dash.page_executions))
        return self.dash.render(request, "schedules.html", active="schedules", rows=rows or [], page_error=error)

    async def cancel_execution(self, request: Request) -> Response:
        form = await _form(request)
        eid, tenant = str(form.get("execution_id", "")), str(form.get("tenant", ""))

        def run(_form: dict[str, Any]) -> Outcome:
            return executions.cancel(executions.tenant_flows(self.dash.action_flows, tenant), eid)

        return await self.act(request, _execution_path(eid, tenant), run)

    async def resume_execution(self, request: Request) -> Response:
        form = await _form(request)
        eid, tenant = str(form.get("execution_id", "")), str(form.get("tenant", ""))

        def run(form: dict[str, Any]) -> Outcome:
            flows = executions.tenant_flows(self.dash.action_flows, tenant)
            fields = (form.get(k, "") for k in ("type", "data", "resume_id", "wait_for"))
            return executions.resume(flows, eid, *fields)

        return await self.act(request, _execution_path(eid, tenant), run)

    async def fork_execution(self, request: Request) -> Response:
        form = await _form(request)
        eid, tenant = str(form.get("execution_id", "")), str(form.get("tenant", ""))

        def run(form: dict[str, Any]) -> Outcome:
            flows = executions.tenant_flows(self.dash.action_flows, tenant)
            new_id, outcome = executions.fork(flows, eid, str(form.get("from_step", "")))
            return replace(outcome, goto=_execution_path(new_id, tenant))

        return await self.act(request, _execution_path(eid, tenant), run)

    async def delete_execution(self, request: Request) -> Response:
        form = await _form(request)
        eid, tenant = str(form.get("execution_id", "")), str(form.get("tenant", ""))
        listing = "/executions" + (f"?tenant={quote(tenant, safe='')}" if tenant else "")
        if form.get("confirm") != "yes":  # step one: say what goes, ask again
            try:
                self.dash.guard.check_action(request, form.get("csrf"))
            except Forbidden as exc:
                return self.dash.render(request, "message.html", 403, title="Refused", text=str(exc))
            return self.dash.render(
                request, "delete_execution.html", active="executions", eid=eid, tenant=tenant,
                back=_execution_path(eid, tenant),
            )  # fmt: skip

        def run(_form: dict[str, Any]) -> Outcome:
            flows = executions.tenant_flows(self.dash.action_flows, tenant)
            return replace(executions.delete(flows, eid), goto=listing)

        return await self.act(request, _execution_path(eid, tenant), run)

    async def act(self, request: Request, back: str, run: Callable[[dict[str, Any]], Outcome]) -> Response:
        form = await _form(request)
        try:
            self.dash.guard.check_action(request, form.get("csrf"))
        except Forbidden as exc:
            return self.dash.render(request, "message.html", 403, title="Refused", text=str(exc))
        try:
            outcome = await run_in_threadpool(run, form)
            notice = self.dash.notices.add("ok", outcome.message, outcome.replies)
            back = outcome.goto or back
        except ActionError as exc:
            notice = self.dash.notices.add("error", str(exc))
        except Exception as exc:
            if not is_redis_failure(exc):
                raise
            notice = self.dash.notices.add("error", _redis_text(self.dash, exc))
        sep = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{sep}notice={notice}", status_code=303)

    async def control(self, request: Request) -> Response:
        def run(form: dict[str, Any]) -> Outcome:
            return actions.control(self.dash.action_fleet, form.get("instance", ""), form.get("command", ""))

        return await self.act(request, "/workers", run)

    async def requeue(self, request: Request) -> Response:
        def run(form: dict[str, Any]) -> Outcome:
            if form.get("all_matching"):
                q, after, until = (str(form.get(k, "")).strip()[:200] for k in ("q", "after", "until"))
                return dlq_view.requeue_matching(self.dash.action_dlq, q, after, until)
            return actions.requeue(self.dash.action_dlq, list(form.get("id") or []))

        return await self.act(request, "/dlq", run)

    async def purge(self, request: Request) -> Response:
        form = await _form(request)
        if form.get("confirm") != "yes":  # step one: show what would go, ask again
            try:
                self.dash.guard.check_action(request, form.get("csrf"))
            except Forbidden as exc:
                return self.dash.render(request, "message.html", 403, title="Refused", text=str(exc))
            length, error = await _read(self.dash, self.dash.action_dlq.length)
            return self.dash.render(request, "purge.html", active="dlq", length=length, page_error=error)
        return await self.act(
            request, "/dlq", lambda f: actions.purge(self.dash.action_dlq, _int(form.get("expected")))
        )

    async def login_page(self, request: Request) -> Response:
        return self.dash.render(request, "login.html", active="", failed=False)

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        try:
            self.dash.guard.check_origin(request)
        except Forbidden as exc:
            return self.dash.render(request, "message.html", 403, title="Refused", text=str(exc))
        if not self.dash.config.allow_actions or not self.dash.guard.token_matches(form.get("token", "")):
            return self.dash.render(request, "login.html", 403, active="", failed=True)
        session = self.dash.guard.new_session()
        response = RedirectResponse("/workers", status_code=303)
        response.set_cookie(SESSION_COOKIE, session.session_id, httponly=True, samesite="strict", path="/")
        return response

    async def logout(self, request: Request) -> Response:
        self.dash.guard.end_session(request)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def routes(dash: Dashboard) -> list[Route]:
    """Every route, bound to ``dash``."""
    v = Views(dash)
    return [
        Route("/", v.overview),
        Route("/fragment/overview", v.overview_fragment),
        Route("/api/overview", v.overview_json),
        Route("/workers", v.workers),
        Route("/workers/control", v.control, methods=["POST"]),
        Route("/dlq", v.dlq),
        Route("/dlq/entry/{dlq_id:path}", v.dlq_entry),  # path: a partitioned id is <p>/<id>
        Route("/dlq/requeue", v.requeue, methods=["POST"]),
        Route("/dlq/purge", v.purge, methods=["POST"]),
        Route("/executions", v.execution_list),
        Route("/executions/cancel", v.cancel_execution, methods=["POST"]),
        Route("/executions/resume", v.resume_execution, methods=["POST"]),
        Route("/executions/fork", v.fork_execution, methods=["POST"]),
        Route("/executions/delete", v.delete_execution, methods=["POST"]),
        Route("/executions/{execution_id:path}", v.execution_page),
        Route("/schedules", v.schedules),
        Route("/login", v.login_page),
        Route("/login", v.login, methods=["POST"]),
        Route("/logout", v.logout, methods=["POST"]),
    ]


def _execution_path(execution_id: str, tenant: str = "") -> str:
    if not executions.valid_id(execution_id):
        return "/executions"
    path = f"/executions/{quote(execution_id, safe='')}"
    return f"{path}?tenant={quote(tenant, safe='')}" if tenant else path


def _int(text: Any) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return -1
