"""The manager dashboard: every session's state, live from the event log (docs/model.md#events), as far as
the manager may see (docs/model.md#access).

Thin edge: every view builds the caller from the logged-in user
(``access.caller_for_user``: managers see the projects where they hold the manager role),
looks objects up through ``caller.sessions()``/``caller.projects()`` (anything else is 404,
never 403: ids are not an oracle), calls an existing action for writes, and renders.

The project page's approve / refuse buttons post to ``approve_intent``/``refuse_intent``, which
call the write-intent approval actions with the manager as the caller (managers carry the
``approve`` permission). Someone who only reviews is sent from the overview to ``/reviews/``.

Pages are server-rendered with the current truth, so they make sense with JavaScript off.
Each page also carries the event-log cursor it was rendered at (read *before* the data, so a
change committed in between is replayed, never missed); ``static/js`` subscribes to
``/ws/events/`` after that id and re-fetches the small partials below when events arrive.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Prefetch, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from novelforge_sessions import access
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.control import intents as intent_actions
from novelforge_sessions.control import results as result_actions
from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.control.models import Handoff, WriteIntent
from novelforge_sessions.dashboard import charts as charts_mod
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.errors import NotFound, ResumeRefused, ServiceError, VersionConflict
from novelforge_sessions.live.replay import latest_event_id
from novelforge_sessions.models import (
    Artifact,
    ArtifactVersion,
    Checkpoint,
    Project,
    Run,
    RuntimeAttachment,
    Session,
)
from reviews.models import ReviewGate

PAGE_SIZE = 50
FEED_SIZE = 25
#: Session-page panels re-rendered by ``session_panels`` (keys match ``data-panel`` attributes).
SESSION_PANELS = ("identity", "conflicts", "charts", "diagram", "timeline", "handoffs", "checkpoints", "runtimes", "actions", "reviews")
#: Handoffs drawn on the timeline (the newest of the shown runs); the panel lists the rest.
TIMELINE_HANDOFFS = 200
#: Checkpoints drawn on the timeline (the newest of the shown runs): a run of a long graph holds
#: hundreds of thousands, more than a track has pixels; each bar says how many it leaves out.
TIMELINE_CHECKPOINTS = 200
#: Review gates flagged on the timeline (the newest of the shown runs).
TIMELINE_GATES = 100


# ------------------------------------------------------------------------------------
# Lookups (404 for anything the caller may not see)
# ------------------------------------------------------------------------------------
def _caller(request: HttpRequest) -> Caller:
    return access.caller_for_user(request.user)


def _visible_session(who: Caller, session_id: int) -> Session:
    try:
        return who.sessions().select_related("project").get(id=session_id)
    except Session.DoesNotExist:
        raise Http404("session not found") from None


def _visible_project(who: Caller, project_id: int) -> Project:
    try:
        return who.projects().get(id=project_id)
    except Project.DoesNotExist:
        raise Http404("project not found") from None


def _int_param(raw: str | None) -> int | None:
    """A form/query id: ASCII digits that fit a bigint, else None (never a 500 on odd input)."""
    raw = raw or ""
    return int(raw) if re.fullmatch(r"[0-9]{1,18}", raw) else None


def _json_404(what: str) -> JsonResponse:
    err = NotFound(f"{what} not found")
    return JsonResponse(err.as_dict(), status=err.http_status)


def _nav(request: HttpRequest) -> dict[str, bool]:
    """The top nav's flags (``templates/dashboard/_nav.html``)."""
    return presenters.nav_roles(request.user)


# ------------------------------------------------------------------------------------
# Overview
# ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Filters:
    """The overview's filters; values outside their choices are dropped, a foreign project is 404."""

    project: int | None = None
    role: str | None = None
    state: str | None = None
    family: str | None = None

    @classmethod
    def from_request(cls, request: HttpRequest, who: Caller) -> Filters:
        raw_project = request.GET.get("project") or ""
        project = _int_param(raw_project)
        if raw_project and project not in who.project_ids:
            raise Http404("project not found")
        role = request.GET.get("role") or None
        state = request.GET.get("state") or None
        family = (request.GET.get("family") or "").strip()[:64] or None
        return cls(
            project=project,
            role=role if role in {r.value for r in rt.SessionRole} else None,
            state=state if state in presenters.STATES else None,
            family=family,
        )

    def apply(self, qs: QuerySet[Session], *, with_state: bool = True) -> QuerySet[Session]:
        if self.project is not None:
            qs = qs.filter(project_id=self.project)
        if self.role:
            qs = qs.filter(role=self.role)
        if self.family:
            # A family the database cannot compare (U+0000 in the query string) names no session:
            # no match, as for any family nobody uses (the API's filter refuses it: 422).
            qs = qs.filter(runtime_family=self.family) if rt.is_storable_text(self.family) else qs.none()
        if with_state and self.state:
            qs = qs.filter(status=self.state)
        return qs

    def params(self, **override: Any) -> dict[str, Any]:
        values = {"project": self.project, "role": self.role, "state": self.state, "family": self.family}
        values.update(override)
        return {k: v for k, v in values.items() if v not in (None, "")}

    def query(self, **override: Any) -> str:
        params = self.params(**override)
        return ("?" + urlencode(params)) if params else "?"


def _counts(who: Caller, filters: Filters) -> dict[str, Any]:
    """Sessions per state under the current filters (the state filter itself excluded)."""
    rows = filters.apply(who.sessions(), with_state=False).values("status").annotate(n=Count("id")).order_by()
    by_state = {row["status"]: row["n"] for row in rows}
    return {"counts": {s: by_state.get(s, 0) for s in presenters.STATES}, "total": sum(by_state.values())}


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    who = _caller(request)
    nav = _nav(request)
    if not who.project_ids and nav["is_reviewer"]:
        # Someone who only reviews has no sessions to watch: their landing page is the queue
        # (login sends everyone to "/", LOGIN_REDIRECT_URL).
        return redirect(reverse("reviews:queue"))
    filters = Filters.from_request(request, who)
    cursor = latest_event_id()  # before reading the data: see the module docstring
    qs = filters.apply(who.sessions()).select_related("project").order_by("-id")
    before = _int_param(request.GET.get("before"))
    if before is not None:
        qs = qs.filter(id__lt=before)
    page = list(qs[: PAGE_SIZE + 1])
    older = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    projects = list(who.projects().order_by("name"))
    counts = _counts(who, filters)
    context = {
        "filters": filters,
        "rows": presenters.session_rows(page),
        "counts": [
            {"state": s, "n": counts["counts"][s], "href": filters.query(state=s, before=None), "active": filters.state == s}
            for s in presenters.STATES
        ],
        "all_href": filters.query(state=None, before=None),
        "newest_href": filters.query(),
        "total": counts["total"],
        "older_query": filters.query(before=page[-1].id) if older else None,
        "paged": before is not None,
        "projects": projects,
        # One project: its name is in the heading, a column of it says nothing.
        "show_project": len(projects) > 1 and filters.project is None,
        "roles": [r.value for r in rt.SessionRole],
        "states": presenters.STATES,
        "attention_states": sorted(lc.ATTENTION_STATUSES),
        "families": list(who.sessions().order_by("runtime_family").values_list("runtime_family", flat=True).distinct()),
        "feed": presenters.event_views(
            presenters.newest_events([filters.project] if filters.project else who.project_ids, FEED_SIZE)
        ),
        "charts": _overview_charts(who, filters),
        "cursor": cursor,
        "live_projects": [filters.project] if filters.project else sorted(who.project_ids),
        "filter_params": filters.params(),
        **nav,
    }
    return render(request, "dashboard/overview.html", context)


def _overview_charts(who: Caller, filters: Filters) -> charts_mod.Charts:
    """The overview's charts: the filtered project (or all the manager's), every session of it."""
    scope_filters = Filters(project=filters.project)
    project_ids = (filters.project,) if filters.project else tuple(sorted(who.project_ids))
    return charts_mod.build(charts_mod.Scope(project_ids=project_ids), _counts(who, scope_filters)["counts"].items())


@login_required
@require_GET
def overview_charts(request: HttpRequest) -> HttpResponse:
    """The overview's charts (HTML), re-fetched by static/js/overview.js as events arrive."""
    who = _caller(request)
    filters = Filters.from_request(request, who)
    return render(request, "dashboard/_charts.html", {"charts": _overview_charts(who, filters)})


@login_required
@require_GET
def counts(request: HttpRequest) -> JsonResponse:
    who = _caller(request)
    try:
        filters = Filters.from_request(request, who)
    except Http404:
        return _json_404("project")
    return JsonResponse(_counts(who, filters))


@login_required
@require_GET
def session_row(request: HttpRequest, session_id: int) -> HttpResponse:
    """One overview row (HTML), or 204 when the session no longer matches the filters."""
    who = _caller(request)
    filters = Filters.from_request(request, who)
    session = filters.apply(who.sessions().select_related("project")).filter(id=session_id).first()
    if session is None:
        _visible_session(who, session_id)  # 404 unless merely filtered out
        return HttpResponse(status=204)
    show_project = len(who.project_ids) > 1 and filters.project is None
    return render(request, "dashboard/_session_row.html",
                  {"row": presenters.session_rows([session])[0], "show_project": show_project})


# ------------------------------------------------------------------------------------
# Session page
# ------------------------------------------------------------------------------------
def _session_context(session: Session) -> dict[str, Any]:
    runtimes = list(RuntimeAttachment.objects.filter(session=session).order_by("-generation")[:20])
    # Live by its lease (docs/model.md#runtimes-and-leases): a record still saying live after its lease ran out is not.
    live = next((a for a in runtimes if a.live), None)
    expired = next((a for a in runtimes if a.lease_expired), None)
    runs = list(Run.objects.filter(session=session).order_by("-seq")[:12])
    runs.reverse()
    open_run = next((r for r in runs if r.state == rt.RunState.OPEN), None)
    hidden_runs = max(session.run_count - len(runs), 0)
    timeline_cps = list(  # the newest, walking the (session, id) index back, however many the runs hold
        # ``session_id__any`` and ``-session_id`` keep the planner on that walk (``models.AnyId``): with
        # ``session = x AND run IN (…)`` it guessed a handful of rows and read all the session's.
        Checkpoint.objects.filter(session_id__any=[session.id], run__in=runs)
        .only("id", "run_id", "seq", "boundary", "created_at")
        .order_by("-session_id", "-id")[:TIMELINE_CHECKPOINTS]
    )
    timeline_handoffs = list(
        Handoff.objects.filter(run__in=runs).defer("inputs", "params", "result_schema").order_by("-id")[:TIMELINE_HANDOFFS]
    )
    timeline_gates = list(  # the newest, walking the (session, id) index back, as the checkpoints
        ReviewGate.objects.filter(session_id__any=[session.id], run__in=runs)
        .only("id", "run_id", "route", "state", "outcome", "bound_verdicts", "required_verdicts", "created_at")
        .order_by("-session_id", "-id")[:TIMELINE_GATES]
    )
    checkpoints = list(Checkpoint.objects.filter(session=session).select_related("run").order_by("-id")[:20])
    for cp in checkpoints:
        cp.cursor_json = presenters.compact_json(cp.cursor)
        cp.pending_json = presenters.compact_json(cp.pending) if cp.pending else ""
        cp.approvals_json = presenters.compact_json(cp.approvals) if cp.approvals else ""
    status = rt.SessionStatus(session.status)
    allowed = lc.SESSION.table[status]
    # A running session whose runtime's lease ran out is failed / runtime_lost in all but the
    # record: resume records that first (as the reconciler would), so it is offered.
    runtime_gone = expired is not None and lc.status_after_runtime_loss(status) != status
    can_resume = lc.resumable(status, runtime_lease_expired=expired is not None) and live is None
    if runtime_gone:
        resume_note = ""
    elif status is rt.SessionStatus.RUNNING:
        resume_note = _("the session is already running")
    elif not lc.resumable(status):
        resume_note = _("a %(state)s session cannot return to running") % {"state": presenters.state_label(status)}
    elif live is not None:
        resume_note = _("generation %(gen)s is live: close it before resuming") % {"gen": live.generation}
    else:
        resume_note = ""
    return {
        "session": session,
        "project": session.project,
        "metadata_json": presenters.pretty_json(session.provider_metadata) if session.provider_metadata else "",
        "runtimes": runtimes,
        "live_runtime": live,
        "expired_runtime": expired,
        "latest_runtime": runtimes[0] if runtimes else None,
        "runs": runs,
        "open_run": open_run,
        "checkpoints": checkpoints,
        "diagram": presenters.build_diagram(session.status, presenters.transition_path(session.id)),
        "timeline": presenters.build_timeline(session, runs, timeline_cps, list(reversed(runtimes)), hidden_runs,
                                              handoffs=timeline_handoffs, gates=timeline_gates),
        "handoffs": presenters.session_handoffs(session.id),
        "conflicts": presenters.open_conflicts(session.id),
        "charts": charts_mod.build(charts_mod.Scope(session_id=session.id), {session.status: 1}.items(), single_session=True),
        "can_close": live is not None,
        "can_abort": open_run is not None and open_run.abort_requested_at is None,
        "abort_pending": open_run is not None and open_run.abort_requested_at is not None,
        "can_terminate": rt.SessionStatus.TERMINATED in allowed,
        "can_resume": can_resume,
        "resume_note": resume_note,
    }


@login_required
@require_GET
def session_detail(request: HttpRequest, session_id: int) -> HttpResponse:
    who = _caller(request)
    cursor = latest_event_id()
    session = _visible_session(who, session_id)
    context = _session_context(session)
    context["cursor"] = cursor
    context["feed"] = presenters.event_views(presenters.session_feed(session.id, 40))
    context.update(_nav(request))
    return render(request, "dashboard/session.html", context)


@login_required
@require_GET
def session_panels(request: HttpRequest, session_id: int) -> JsonResponse:
    """The session page's live panels, re-rendered from the current truth (JSON of HTML)."""
    who = _caller(request)
    try:
        session = _visible_session(who, session_id)
    except Http404:
        return _json_404("session")
    context = _session_context(session)
    panels = {
        name: render_to_string(f"dashboard/panels/{name}.html", context, request=request) for name in SESSION_PANELS
    }
    return JsonResponse({"status": session.status, "version": session.version, "panels": panels})


# ------------------------------------------------------------------------------------
# Manager actions: POST only, CSRF-protected (middleware), each one existing action
# ------------------------------------------------------------------------------------
def _after_action(session_id: int) -> HttpResponse:
    return redirect(reverse("dashboard:session", args=[session_id]))


def _report_error(request: HttpRequest, exc: ServiceError) -> None:
    if exc.message.endswith(rt.UNSTORABLE_TEXT):  # the actions' refusal of text the database cannot hold
        messages.error(request, _("Nothing was changed: the %(field)s contains a character that cannot be saved "
                                  "(a NUL character, U+0000). Remove it and try again.") % {"field": exc.details.get("field", "text")})
        return
    messages.error(request, f"{presenters.error_words(exc.code, exc.message)} ({exc.code})")


@login_required
@require_POST
def close_session(request: HttpRequest, session_id: int) -> HttpResponse:
    who = _caller(request)
    _visible_session(who, session_id)
    try:
        result = session_actions.close_session(who, session_id, reason="closed by manager")
    except ServiceError as exc:
        _report_error(request, exc)
    else:
        if result.already_closed:
            messages.info(request, _("No runtime was live; nothing to close."))
        else:
            messages.success(request, _("Closed the live runtime (#%(id)s).") % {"id": result.closed_runtime_id})
    return _after_action(session_id)


@login_required
@require_POST
def abort_session(request: HttpRequest, session_id: int) -> HttpResponse:
    who = _caller(request)
    _visible_session(who, session_id)
    try:
        result = session_actions.abort_session(who, session_id, reason="abort requested by manager")
    except ServiceError as exc:
        _report_error(request, exc)
    else:
        if result.already_requested:
            messages.info(request, _("An abort was already requested for this run."))
        else:
            messages.success(request, _("Abort requested: the runtime stops the run at its next heartbeat."))
    return _after_action(session_id)


@login_required
@require_POST
def terminate_session(request: HttpRequest, session_id: int) -> HttpResponse:
    who = _caller(request)
    _visible_session(who, session_id)
    version = _int_param(request.POST.get("version"))
    if version is None:
        # The form always carries the version the manager saw; without it there is nothing to confirm.
        messages.error(request, _("The form did not say which version of the session you saw; reload and try again."))
        return _after_action(session_id)
    try:
        session_actions.transition_session(
            who, session_id, rt.SessionStatus.TERMINATED.value, reason="terminated by manager", expected_version=version
        )
    except VersionConflict as exc:
        messages.error(request, _("The session changed since you loaded the page (it is now %(state)s). Check it and try again.")
                       % {"state": presenters.state_label(exc.details.get("status"))})
    except ServiceError as exc:
        _report_error(request, exc)
    else:
        messages.success(request, _("Session terminated."))
    return _after_action(session_id)


@login_required
@require_POST
def resolve_conflict(request: HttpRequest, session_id: int, handoff_id: int) -> HttpResponse:
    """Resolve a conflicting result from the page: the same control-plane action as
    ``POST /api/v1/handoffs/{id}/resolve-conflict`` (permission ``approve``; the consumed result stands)."""
    who = _caller(request)
    session = _visible_session(who, session_id)
    if not Handoff.objects.filter(id=handoff_id, session=session).exists():
        raise Http404("handoff not found")
    resolution = (request.POST.get("resolution") or "").strip()
    try:
        handoff = result_actions.resolve_conflict(who, handoff_id, resolution=resolution)
    except ServiceError as exc:
        _report_error(request, exc)
        return redirect(reverse("dashboard:session", args=[session_id]) + "#conflicts")
    messages.success(request, _("Conflict on handoff %(job)s resolved: the consumed result stands.") % {"job": handoff.logical_id})
    return _after_action(session_id)


def _resume_spec(session: Session) -> RuntimeSpec:
    """The runtime a resume from the page attaches: the session's family, the latest capabilities."""
    latest = RuntimeAttachment.objects.filter(session=session).order_by("-generation").first()
    return RuntimeSpec(runtime_family=session.runtime_family, capabilities=list(latest.capabilities) if latest else [])


@login_required
@require_http_methods(["GET", "POST"])
def resume(request: HttpRequest, session_id: int) -> HttpResponse:
    """GET: the dry-run report (every step ✓/✗ with its repair). POST: confirm and resume."""
    who = _caller(request)
    session = _visible_session(who, session_id)
    spec = _resume_spec(session)
    checkpoint_id = _int_param(request.POST.get("checkpoint_id"))
    report: dict[str, Any] | None = None
    error: ServiceError | None = None
    status = 200
    try:
        outcome = resume_session(who, session_id, runtime=spec, checkpoint_id=checkpoint_id,
                                 dry_run=request.method == "GET", reason="resumed by manager")
    except ResumeRefused as exc:
        report, status = exc.details.get("report"), exc.http_status
    except ServiceError as exc:
        error, status = exc, exc.http_status
    else:
        if request.method == "POST":
            held = outcome.steps[-1].data.get("waiting_on") or []
            waiting = (" " + _("It waits on %(what)s.") % {"what": ", ".join(presenters.wait_words(h["label"]) for h in held)}
                       if held else "")
            messages.success(request, _("Resumed: runtime generation %(gen)s, new run started.") % {"gen": outcome.runtime.generation}
                             + waiting)
            return _after_action(session_id)
        report = outcome.report()
    session.refresh_from_db()
    return render(request, "dashboard/resume.html",
                  {"session": session, "project": session.project, "error": error, "spec": spec,
                   "report": presenters.resume_report(report) if report else None,
                   "confirmed": request.method == "POST", **_nav(request)},
                  status=status)


# ------------------------------------------------------------------------------------
# Project page
# ------------------------------------------------------------------------------------
@login_required
@require_GET
def project_detail(request: HttpRequest, project_id: int) -> HttpResponse:
    who = _caller(request)
    project = _visible_project(who, project_id)
    versions = ArtifactVersion.objects.only("id", "artifact_id", "number", "fingerprint", "created_by", "created_at")
    artifacts = list(
        Artifact.objects.filter(project=project).select_related("current_version")
        .prefetch_related(Prefetch("versions", queryset=versions.order_by("-number"), to_attr="version_list"))
        .order_by("name")[:100]
    )
    counts = {row["status"]: row["n"] for row in
              who.sessions().filter(project=project).values("status").annotate(n=Count("id")).order_by()}
    return render(request, "dashboard/project.html", {
        "project": project,
        "artifacts": artifacts,
        "authority_history": presenters.authority_history(project),
        "counts": [(s, counts.get(s, 0)) for s in presenters.STATES],
        "intents": presenters.project_intents(project),
        "reviews": presenters.project_reviews(project),
        **_nav(request),
    })


def _decide_intent(request: HttpRequest, project_id: int, intent_id: int, *, approve: bool) -> HttpResponse:
    """Approve or refuse a write intent of a project the user manages (404 for anything else)."""
    who = _caller(request)
    project = _visible_project(who, project_id)
    if not WriteIntent.objects.filter(id=intent_id, project=project).exists():
        raise Http404("write intent not found")
    note = (request.POST.get("note") or "").strip()[:500]
    try:
        if approve:
            intent_actions.approve_intent(who, intent_id, note=note)
        else:
            intent_actions.reject_intent(who, intent_id, note=note)
    except ServiceError as exc:
        _report_error(request, exc)
    else:
        if approve:
            messages.success(request, _("Approved write intent #%(id)s: the agent may now execute it.") % {"id": intent_id})
        else:
            messages.success(request, _("Refused write intent #%(id)s: it will not be executed.") % {"id": intent_id})
    return redirect(reverse("dashboard:project", args=[project.id]) + "#write-intents")


@login_required
@require_POST
def approve_intent(request: HttpRequest, project_id: int, intent_id: int) -> HttpResponse:
    return _decide_intent(request, project_id, intent_id, approve=True)


@login_required
@require_POST
def refuse_intent(request: HttpRequest, project_id: int, intent_id: int) -> HttpResponse:
    return _decide_intent(request, project_id, intent_id, approve=False)
