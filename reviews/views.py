"""Reviewer pages: the queue, the packet page (verdict form + peer-chat relay), and the
managers' calibration view. Thin: parse, authorize, call an action, render.

A reviewer sees only their own assignments (404 otherwise) and only what the stored packet
holds plus their own verdict. Refusals re-render the page with the refusal's code and the
field it names; the page never echoes anything the packet does not contain.
"""
from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from novelforge_sessions.api.schemas import loads_json
from novelforge_sessions.errors import NotFound, ServiceError
from novelforge_sessions.models import Project, Session
from reviews import actions, calibration as scoring
from reviews.access import assignment_for, assignments_for, managed_project_ids, reviewer_for_user
from reviews.forms import FindingRow, RelayAnswerForm, finding_rows, verdict_payload_from_post
from reviews.models import GateCalibration, ReviewAssignment, ReviewGate, Verdict
from reviews.packets import DECISIONS, SEVERITIES, relay_prompt, rubric_from_dict


def _assignment_or_404(request: HttpRequest, packet_id: int) -> ReviewAssignment:
    try:
        return assignment_for(reviewer_for_user(request.user), packet_id)
    except NotFound:
        raise Http404("review packet not found") from None


def _nav(request: HttpRequest) -> dict[str, Any]:
    return {"is_manager": bool(managed_project_ids(request.user))}


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    identity = reviewer_for_user(request.user)
    mine = assignments_for(identity).select_related("packet__gate")
    to_review = list(
        mine.filter(state=ReviewAssignment.State.ASSIGNED, packet__gate__state=ReviewGate.State.PENDING)
        .order_by("assigned_at", "id")
    )
    submitted = list(mine.filter(state=ReviewAssignment.State.SUBMITTED).order_by("-submitted_at", "-id")[:50])
    return render(request, "reviews/queue.html", {"to_review": to_review, "submitted": submitted, **_nav(request)})


def _packet_context(request: HttpRequest, assignment: ReviewAssignment, **extra: Any) -> dict[str, Any]:
    packet = assignment.packet
    content = packet.content
    rubric = rubric_from_dict(content["rubric"])
    verdict = Verdict.objects.filter(assignment=assignment).first()
    values: dict[str, str] = extra.pop("values", {})
    errors: dict[str, str] = extra.pop("errors", {})
    # Small scales become a row of radio buttons; wide ones a number input.
    criteria = [
        {"c": c, "choices": [str(n) for n in range(c.min, c.max + 1)] if c.max - c.min <= 10 else None,
         "value": values.get(f"score-{c.key}", ""), "error": errors.get(f"scores.{c.key}", "")}
        for c in rubric.criteria
    ]
    rows: list[FindingRow] = extra.pop("rows", None) or []
    row_errors = [
        [f"{name[len(f'findings[{i}]'):].lstrip('.') or 'finding'}: {msg}" for name, msg in errors.items()
         if name.startswith(f"findings[{i}]")]
        for i in range(len(rows))
    ]
    ctx = {
        "assignment": assignment,
        "packet": packet,
        "route": packet.gate.route,
        "candidate": content["candidate"],
        "lines": content["candidate"]["content"].splitlines(),
        "criteria": criteria,
        "evidence": content.get("evidence", []),
        "verdict": verdict,
        "decisions": DECISIONS,
        "severities": SEVERITIES,
        "relay_prompt": relay_prompt(content, packet.fingerprint),
        "relay_form": extra.pop("relay_form", None) or RelayAnswerForm(),
        "rows": list(zip(rows, row_errors)) + [(FindingRow(), [])],
        "values": values,
        "errors": errors,
        "refusal": extra.pop("refusal", None),
        "relay_refusal": extra.pop("relay_refusal", None),
        "just_bound": request.GET.get("bound") == "1",
        **_nav(request),
    }
    ctx.update(extra)
    return ctx


def _refusal(exc: ServiceError) -> dict[str, Any]:
    """What a page may say about a refusal: its code, message and the fields it names."""
    fields = [e for e in exc.details.get("errors", []) if isinstance(e, dict)]
    if not fields and exc.details.get("field"):
        fields = [{"field": exc.details["field"], "message": exc.message}]
    return {"code": exc.code, "message": exc.message, "fields": fields, "status": exc.http_status}


@login_required
@require_http_methods(["GET", "POST"])
def packet_page(request: HttpRequest, packet_id: int) -> HttpResponse:
    assignment = _assignment_or_404(request, packet_id)
    if request.method == "GET":
        return render(request, "reviews/packet.html", _packet_context(request, assignment))
    rubric = rubric_from_dict(assignment.packet.content["rubric"])
    payload = verdict_payload_from_post(request.POST, rubric)
    try:
        actions.bind_verdict(reviewer_for_user(request.user), packet_id, payload, channel=Verdict.Channel.PAGE)
    except ServiceError as exc:
        refusal = _refusal(exc)
        values = {
            "decision": request.POST.get("decision", ""),
            "confidence": request.POST.get("confidence", ""),
            **{f"score-{c.key}": request.POST.get(f"score-{c.key}", "") for c in rubric.criteria},
        }
        errors = {f["field"]: f["message"] for f in refusal["fields"]}
        ctx = _packet_context(request, assignment, refusal=refusal, values=values, errors=errors, rows=finding_rows(request.POST))
        return render(request, "reviews/packet.html", ctx, status=refusal["status"])
    return HttpResponseRedirect(reverse("reviews:packet", args=[packet_id]) + "?bound=1#confirmation")


@login_required
@require_POST
def relay_paste(request: HttpRequest, packet_id: int) -> HttpResponse:
    """The other chat's answer, pasted back: parsed, then validated and bound like any verdict."""
    assignment = _assignment_or_404(request, packet_id)
    form = RelayAnswerForm(request.POST)
    if not form.is_valid():
        refusal = {"code": "validation_error", "message": form.errors["answer"][0], "fields": [{"field": "answer", "message": form.errors["answer"][0]}], "status": 422}
        return render(request, "reviews/packet.html", _packet_context(request, assignment, relay_form=form, relay_refusal=refusal), status=422)
    try:
        payload = loads_json(form.cleaned_data["answer"])  # the API's parser: NaN/Infinity/1e999 refused by name
    except ServiceError as exc:
        ctx = _packet_context(request, assignment, relay_form=form, relay_refusal=_refusal(exc))
        return render(request, "reviews/packet.html", ctx, status=exc.http_status)
    except json.JSONDecodeError as exc:
        refusal = {
            "code": "malformed_body", "status": 400,
            "message": f"The answer is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). "
            "Paste only the JSON object, without prose or code fences.",
            "fields": [{"field": "body", "message": "not valid JSON"}],
        }
        return render(request, "reviews/packet.html", _packet_context(request, assignment, relay_form=form, relay_refusal=refusal), status=400)
    try:
        actions.bind_verdict(reviewer_for_user(request.user), packet_id, payload, channel=Verdict.Channel.RELAY)
    except ServiceError as exc:
        refusal = _refusal(exc)
        ctx = _packet_context(request, assignment, relay_form=form, relay_refusal=refusal)
        return render(request, "reviews/packet.html", ctx, status=refusal["status"])
    return HttpResponseRedirect(reverse("reviews:packet", args=[packet_id]) + "?bound=1#confirmation")


@login_required
def relay_export(request: HttpRequest, packet_id: int) -> HttpResponse:
    assignment = _assignment_or_404(request, packet_id)
    packet = assignment.packet
    resp = HttpResponse(relay_prompt(packet.content, packet.fingerprint), content_type="text/plain; charset=utf-8")
    resp["Content-Disposition"] = f'inline; filename="review-packet-{packet.id}.txt"'
    return resp


# ------------------------------------------------------------------------------------------
# Calibration (managers only)
# ------------------------------------------------------------------------------------------
def reviewer_names(keys: set[str]) -> dict[str, str]:
    """Display names for reviewer identity keys ("user:<id>", "session:<id>")."""
    user_ids = {int(k.split(":")[1]) for k in keys if k.startswith("user:")}
    session_ids = {int(k.split(":")[1]) for k in keys if k.startswith("session:")}
    names = {f"user:{pk}": name for pk, name in get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username")}
    for pk, family in Session.objects.filter(pk__in=session_ids).values_list("pk", "runtime_family"):
        names[f"session:{pk}"] = f"agent session #{pk} ({family})"
    return {k: names.get(k, k) for k in keys}


@login_required
def calibration(request: HttpRequest) -> HttpResponse:
    """Per reviewer: agreement with calibration answers and with peers (percent, Cohen's kappa).

    Managers of a project only; anyone else gets 404 (a reviewer must never see answer keys or
    peers' decisions)."""
    project_ids = managed_project_ids(request.user)
    if not project_ids:
        raise Http404("not found")
    sections = []
    for project in Project.objects.filter(id__in=project_ids).order_by("slug"):
        decisions = list(
            Verdict.objects.filter(packet__gate__project=project).values_list("reviewer", "packet_id", "decision")
        )
        expected = dict(
            GateCalibration.objects.filter(gate__project=project)
            .exclude(expected_decision="")
            .values_list("gate__packet__id", "expected_decision")
        )
        rows = scoring.calibration_report(decisions, expected)
        names = reviewer_names({r.reviewer for r in rows})
        sections.append({"project": project, "rows": [(names[r.reviewer], r) for r in rows],
                         "calibrated_packets": len(expected), "verdicts": len(decisions)})
    return render(request, "reviews/calibration.html", {"sections": sections, **_nav(request)})
