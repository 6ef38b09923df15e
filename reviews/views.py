"""Reviewer pages: the queue, the packet page (verdict form + peer-chat relay), and the
managers' calibration view. Thin: parse, authorize, call an action, render.

A reviewer sees only their own assignments (404 otherwise) and only what the stored packet
holds plus their own verdict. Refusals re-render the page in plain words ("Please score
Clarity"), keeping the refusal's code and field names under "Technical details"; the page never
echoes anything the packet does not contain. A pasted relay answer may be a bare JSON object,
a ```json block or an object in prose (``reviews.relay.extract_answer``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import get_language, gettext, gettext_lazy
from django.views.decorators.http import require_http_methods, require_POST

from novelforge_sessions.apikit.schemas import loads_json
from novelforge_sessions.counting import count_up_to
from novelforge_sessions.errors import MalformedBody, NotFound, ServiceError, ValidationFailed, page_message
from novelforge_sessions.models import Membership, Project, Session
from novelforge_sessions.phrases import say
from novelforge_sessions.session_runtime import UNSTORABLE_TEXT
from reviews import actions, calibration as scoring, relay
from reviews.access import assignment_for, assignments_for, managed_project_ids, reviewer_for_user
from reviews.forms import FindingRow, RelayAnswerForm, finding_rows, verdict_payload_from_post
from reviews.models import GateCalibration, ReviewAssignment, ReviewGate, Verdict
from reviews.packets import (
    CONFIDENCE_LEVELS, DECISION_LABELS, DECISIONS, SEVERITIES, Rubric, relay_prompt, rubric_from_dict,
)
from reviews.verdicts import FIELD_MESSAGE, LOCATION_HINT

_FINDING_FIELD = re.compile(r"^findings\[(\d{1,3})\](?:\.(\w+))?$")  # a real index (at most 50 findings)
#: What the confirmation may say about where a relay answer was found (query parameters, allowlisted).
_EXTRACTED = relay.WHERE
_LINES_PARAM = re.compile(r"^\d{1,6}(-\d{1,6})?$")


def _assignment_or_404(request: HttpRequest, packet_id: int) -> ReviewAssignment:
    try:
        return assignment_for(reviewer_for_user(request.user), packet_id)
    except NotFound:
        raise Http404("review packet not found") from None


def _nav(request: HttpRequest) -> dict[str, Any]:
    return {"is_manager": bool(managed_project_ids(request.user))}


#: Rows per list on the queue page (each list pages on its own).
QUEUE_PAGE_SIZE = 50
_CURSOR = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class QueueList:
    """One list of the queue page: a keyset page of it, the true total, and the links on."""

    rows: list[ReviewAssignment]
    total: int
    more_href: str | None  # the next page ("Newer" / "Older")
    first_href: str | None  # back to the list's first page, when this is not it


def _anchor(mine: QuerySet[ReviewAssignment], raw: str | None) -> ReviewAssignment | None:
    """The cursor's row: one of the caller's own packets (a packet id, as the page shows them).
    Anything else — odd input, someone else's packet, no such packet — is no cursor: the first
    page (ids are not an oracle)."""
    if not raw or not _CURSOR.fullmatch(raw):
        return None
    return mine.filter(packet_id=int(raw)).only("id", "assigned_at", "submitted_at").first()


def _href(request: HttpRequest, param: str, value: int | None) -> str:
    """A queue link that moves one list (``param``) and keeps the other list where it is."""
    params = {k: v for k, v in request.GET.items() if k in ("after", "before") and k != param and _CURSOR.fullmatch(v)}
    if value is not None:
        params[param] = str(value)
    return "?" + urlencode(sorted(params.items())) if params else reverse("reviews:queue")


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    """Two keyset-paged lists: "To review" oldest first (``?after=<packet id>`` of the last row
    shown), "Submitted" newest first (``?before=<packet id>``). Each keeps the other's cursor
    in its links; the counts are the true totals (up to ``COUNT_CAP``), not the page's length."""
    identity = reviewer_for_user(request.user)
    mine = assignments_for(identity)
    waiting = Q(state=ReviewAssignment.State.ASSIGNED, packet__gate__state=ReviewGate.State.PENDING)
    done = Q(state=ReviewAssignment.State.SUBMITTED)
    # Counted up to COUNT_CAP each (the page says "1000+" beyond), not over every assignment;
    # unordered (count_up_to), since in the lists' order the planner sorted all the reviewer's slots first.
    totals = {"to_review": count_up_to(mine.filter(waiting)), "submitted": count_up_to(mine.filter(done))}

    to_review = mine.filter(waiting).select_related("packet__gate").order_by("assigned_at", "id")
    after = _anchor(mine, request.GET.get("after"))
    if after is not None and after.assigned_at is not None:
        to_review = to_review.filter(Q(assigned_at__gt=after.assigned_at) | Q(assigned_at=after.assigned_at, id__gt=after.id))
    else:
        after = None
    submitted = mine.filter(done).select_related("packet__gate").order_by("-submitted_at", "-id")
    before = _anchor(mine, request.GET.get("before"))
    if before is not None and before.submitted_at is not None:
        submitted = submitted.filter(
            Q(submitted_at__lt=before.submitted_at) | Q(submitted_at=before.submitted_at, id__lt=before.id)
        )
    else:
        before = None

    def page(qs: QuerySet[ReviewAssignment], total: int, param: str, paged: bool) -> QueueList:
        rows = list(qs[: QUEUE_PAGE_SIZE + 1])
        more = len(rows) > QUEUE_PAGE_SIZE
        rows = rows[:QUEUE_PAGE_SIZE]
        return QueueList(rows, total, _href(request, param, rows[-1].packet_id) if more else None,
                         _href(request, param, None) if paged else None)

    return render(request, "reviews/queue.html", {
        "to_review": page(to_review, totals["to_review"], "after", after is not None),
        "submitted": page(submitted, totals["submitted"], "before", before is not None),
        **_nav(request),
    })


def _packet_context(request: HttpRequest, assignment: ReviewAssignment, **extra: Any) -> dict[str, Any]:
    packet = assignment.packet
    content = packet.content
    rubric = rubric_from_dict(content["rubric"])
    verdict = Verdict.objects.filter(assignment=assignment).first()
    values: dict[str, str] = extra.pop("values", {})
    errors: dict[str, str] = extra.pop("errors", {})
    # Small scales become a row of radio buttons (each with its anchor, if the rubric gives one);
    # wide ones a number input with the anchors listed.
    criteria = [
        {"c": c, "choices": [(str(n), c.anchor(n)) for n in range(c.min, c.max + 1)] if c.max - c.min <= 10 else None,
         "anchors_text": c.anchors_text(),
         "value": values.get(f"score-{c.key}", ""), "error": errors.get(f"scores.{c.key}", "")}
        for c in rubric.criteria
    ]
    rows: list[FindingRow] = extra.pop("rows", None) or []
    row_errors = [
        [msg for name, msg in errors.items() if name.startswith(f"findings[{i}]")]
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
        "confidence_levels": [(str(v), gettext(label)) for _, label, v in CONFIDENCE_LEVELS],
        "location_hint": gettext(LOCATION_HINT),
        "has_anchors": any(c.anchors for c in rubric.criteria),
        "next_packet": _next_packet(request, assignment) if verdict else None,
        "extracted": _extracted_note(request) if verdict else "",
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


def _next_packet(request: HttpRequest, current: ReviewAssignment) -> ReviewAssignment | None:
    """The oldest other packet waiting for this reviewer (the queue's first row), if any."""
    return (
        assignments_for(reviewer_for_user(request.user))
        .filter(state=ReviewAssignment.State.ASSIGNED, packet__gate__state=ReviewGate.State.PENDING)
        .exclude(id=current.id).order_by("assigned_at", "id").first()
    )


def _extracted_note(request: HttpRequest) -> str:
    source, lines = request.GET.get("extracted", ""), request.GET.get("lines", "")
    if source not in _EXTRACTED:
        return ""
    if not _LINES_PARAM.match(lines):
        return gettext("Read one JSON object from %(source)s of the pasted answer.") % {"source": gettext(_EXTRACTED[source])}
    where = (gettext("line %(n)s") if "-" not in lines else gettext("lines %(n)s")) % {"n": lines.replace("-", "–")}
    return gettext("Read one JSON object from %(source)s (%(lines)s) of the pasted answer.") % {
        "source": gettext(_EXTRACTED[source]), "lines": where}


_FINGERPRINT_FIELDS = ("packet_fingerprint", "artifact_fingerprint")
_RELAY_FINGERPRINTS = gettext_lazy("The reply does not quote this packet's fingerprints exactly. Ask the other chat to copy "
                                   "packet_fingerprint and artifact_fingerprint from the prompt as written.")


#: Text the database cannot hold (``session_runtime.UNSTORABLE_TEXT``), said for a person.
_UNSTORABLE_PLAIN = gettext_lazy("contains a character that cannot be saved (a NUL character, U+0000, or half of a "
                                 "surrogate pair such as \\ud800)")


def plain_message(field: str, message: str, rubric: Rubric, *, relay: bool = False) -> str:
    """A refusal of one field, said for a person rather than an engineer. For the relay (the
    other chat's reply), a missing top-level field is named as the chat must write it."""
    if message == UNSTORABLE_TEXT:
        m = _FINDING_FIELD.match(field)
        where = (gettext("Finding %(n)s's %(part)s") % {"n": int(m.group(1)) + 1, "part": m.group(2) or "text"} if m
                 else gettext("The field %(field)s") % {"field": field})
        if relay:
            return gettext("In the reply, %(where)s %(problem)s. Ask the other chat to answer again without it.") % {
                "where": where[0].lower() + where[1:], "problem": _UNSTORABLE_PLAIN}
        return gettext("%(where)s %(problem)s: please remove it and submit again.") % {"where": where, "problem": _UNSTORABLE_PLAIN}
    if relay and field in _FINGERPRINT_FIELDS:
        return str(_RELAY_FINGERPRINTS)
    if relay and message == "is required" and "." not in field and "[" not in field:
        return gettext("The reply has no %(field)s; ask the other chat to answer with every field the prompt lists.") % {"field": field}
    if relay and message == "unknown field":
        return gettext("The reply has a field the prompt does not ask for (%(field)s); ask the other chat to leave it out.") % {"field": field}
    if field == "decision":
        return gettext("Please choose a decision: %(choices)s.") % {
            "choices": gettext("%(a)s, %(b)s or %(c)s") % dict(zip("abc", map(str, DECISION_LABELS.values())))}
    if field == "confidence":
        return gettext("Please choose how sure you are.")
    if field.startswith("scores."):
        c = rubric.criterion(field[len("scores."):])
        if c is None:
            return gettext("The answer scores something this rubric does not have (%(key)s).") % {"key": field[len("scores."):]}
        if "required" in message:
            return gettext("Please score %(label)s.") % {"label": c.label}
        return gettext("Please give %(label)s a whole-number score from %(min)s to %(max)s.") % {
            "label": c.label, "min": c.min, "max": c.max}
    if m := _FINDING_FIELD.match(field):
        n, part = int(m.group(1)) + 1, m.group(2)
        if part == "location":
            if message.startswith("line ") or "backwards" in message:
                return _finding(n, message)
            return gettext("Finding %(n)s: say which line it is about — %(hint)s.") % {"n": n, "hint": gettext(LOCATION_HINT)}
        if part == "severity":
            return gettext("Finding %(n)s: please choose how serious it is (minor, major or critical).") % {"n": n}
        if part == "note":
            return gettext("Finding %(n)s: please describe the problem.") % {"n": n}
        return _finding(n, message)
    if field in ("packet_fingerprint", "artifact_fingerprint"):
        return str(_PLAIN_CODES["stale_fingerprint"])
    if field == "body":
        return _said(message)
    return gettext(FIELD_MESSAGE) % {"field": field, "message": _said(message)}


def _said(text: str) -> str:
    """A validator's message (a phrase, ``novelforge_sessions.phrases``) in the page's language."""
    return say(text, gettext)


def _finding(n: int, message: str) -> str:
    """"Finding 2: Line 9 is not in the candidate (it has 4 lines).": the validator's message, said in
    the page's language and begun as a sentence."""
    problem = _said(message)
    return gettext("Finding %(n)s: %(problem)s.") % {"n": n, "problem": problem[:1].upper() + problem[1:]}


_PLAIN_CODES = {
    "stale_fingerprint": gettext_lazy("This page is out of date: the text under review changed. Reload the page and review it again."),
    "verdict_conflict": gettext_lazy("You have already submitted a different review of this packet; a review cannot be changed."),
    "gate_closed": gettext_lazy("This review was withdrawn by its author; there is nothing to submit any more."),
    "independence_violation": gettext_lazy("You may not review this text: it is your own work, or you opened this review."),
}


def _refusal(exc: ServiceError, rubric: Rubric | None = None, *, relay: bool = False,
             page_words: bool = False) -> dict[str, Any]:
    """What a page may say about a refusal: plain sentences for people, plus its code, message
    and the fields it names (shown under "Technical details", and kept for the other chat), all in
    the page's language (``errors.page_message``; codes and field names stay as they are).
    ``page_words``: the message is the page's own, already in its language (a form's error)."""
    english = (get_language() or "en").startswith("en")
    message = exc.message if page_words else page_message(exc.code, exc.message, gettext, english=english)
    fields = [e for e in exc.details.get("errors", []) if isinstance(e, dict)]
    if not fields and exc.details.get("field"):
        fields = [{"field": exc.details["field"], "message": exc.message}]
    if relay and exc.code == "stale_fingerprint" and exc.details.get("reason") != "candidate_changed":
        plain = [str(_RELAY_FINGERPRINTS)]
    elif exc.code in _PLAIN_CODES:
        plain = [str(_PLAIN_CODES[exc.code])]
    elif rubric is not None and fields:
        plain = list(dict.fromkeys(plain_message(f["field"], f["message"], rubric, relay=relay) for f in fields))
    else:
        plain = [message]
    for f in fields:
        f["plain"] = plain_message(f["field"], f["message"], rubric, relay=relay) if rubric is not None else message
        if not page_words:
            f["message"] = _field_message(exc.code, f["message"], english)
    return {"code": exc.code, "message": message, "fields": fields, "status": exc.http_status, "plain": plain}


def _field_message(code: str, message: str, english: bool) -> str:
    """One field's refusal under "Technical details", in the page's language."""
    if message == UNSTORABLE_TEXT and not english:
        return str(_UNSTORABLE_PLAIN)
    return page_message(code, message, gettext, english=english)


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
        refusal = _refusal(exc, rubric)
        values = {
            "decision": request.POST.get("decision", ""),
            "confidence": request.POST.get("confidence", ""),
            **{f"score-{c.key}": request.POST.get(f"score-{c.key}", "") for c in rubric.criteria},
        }
        errors = {f["field"]: f["plain"] for f in refusal["fields"]}
        ctx = _packet_context(request, assignment, refusal=refusal, values=values, errors=errors, rows=finding_rows(request.POST))
        return render(request, "reviews/packet.html", ctx, status=refusal["status"])
    return HttpResponseRedirect(reverse("reviews:packet", args=[packet_id]) + "?bound=1#confirmation")


@login_required
@require_POST
def relay_paste(request: HttpRequest, packet_id: int) -> HttpResponse:
    """The other chat's answer, pasted back: its one JSON object found (bare, fenced or in prose),
    then validated and bound like any verdict. Every refusal says why; nothing is bound."""
    assignment = _assignment_or_404(request, packet_id)
    rubric = rubric_from_dict(assignment.packet.content["rubric"])
    form = RelayAnswerForm(request.POST)

    def refuse(refusal: dict[str, Any], extracted: relay.Extracted | None = None) -> HttpResponse:
        ctx = _packet_context(request, assignment, relay_form=form, relay_refusal=refusal, relay_extracted=extracted)
        return render(request, "reviews/packet.html", ctx, status=refusal["status"])

    if not form.is_valid():
        return refuse(_refusal(ValidationFailed(form.errors["answer"][0], field="answer"), page_words=True))
    try:
        found = relay.extract_answer(form.cleaned_data["answer"])
    except relay.ExtractionRefused as exc:
        return refuse(_refusal(MalformedBody(exc.message, field="answer", reason=exc.reason, **exc.details)))
    try:
        payload = loads_json(found.text)  # the API's parser: NaN/Infinity/1e999 refused by name
        actions.bind_verdict(reviewer_for_user(request.user), packet_id, payload, channel=Verdict.Channel.RELAY)
    except ServiceError as exc:
        return refuse(_refusal(exc, rubric, relay=True), found)
    lines = str(found.first_line) if found.first_line == found.last_line else f"{found.first_line}-{found.last_line}"
    return HttpResponseRedirect(
        reverse("reviews:packet", args=[packet_id]) + f"?bound=1&extracted={found.source}&lines={lines}#confirmation"
    )


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


#: Gates per list on the managers' reviews page (waiting ones first, then the latest finished).
GATES_SHOWN = 100


@login_required
def gates(request: HttpRequest) -> HttpResponse:
    """The managers' reviews page: every review gate of the projects they manage, waiting ones
    first (oldest first), then the latest finished, each with its reviewers and where they are.
    Managers only; anyone else gets 404 (a reviewer never sees other reviewers' work)."""
    project_ids = managed_project_ids(request.user)
    if not project_ids:
        raise Http404("not found")
    base = (ReviewGate.objects.filter(project_id__in=project_ids)
            .select_related("project", "run", "candidate__artifact", "packet")
            .prefetch_related(Prefetch("packet__assignments",
                                       queryset=ReviewAssignment.objects.select_related("reviewer_user", "verdict")
                                       .order_by("id"))))
    waiting = list(base.filter(state=ReviewGate.State.PENDING).order_by("created_at", "id")[:GATES_SHOWN])
    finished = list(base.exclude(state=ReviewGate.State.PENDING).order_by("-created_at", "-id")[:GATES_SHOWN])
    keys = {a.reviewer for g in waiting + finished for a in g.packet.assignments.all() if a.reviewer}
    names = reviewer_names(keys)

    def rows(items: list[ReviewGate]) -> list[dict[str, Any]]:
        return [{"gate": g, "reviewers": [(names.get(a.reviewer, a.reviewer) if a.reviewer else gettext("anyone (open)"), a)
                                          for a in g.packet.assignments.all()]} for g in items]

    totals = ReviewGate.objects.filter(project_id__in=project_ids).aggregate(
        waiting=Count("id", filter=Q(state=ReviewGate.State.PENDING)), finished=Count("id", filter=~Q(state=ReviewGate.State.PENDING)))
    return render(request, "reviews/gates.html", {
        "waiting": rows(waiting), "finished": rows(finished), "totals": totals,
        "projects": Project.objects.filter(id__in=project_ids).order_by("name"),
        "show_project": len(project_ids) > 1, "has_queue": Membership.objects.filter(user=request.user, role=Membership.Role.REVIEWER).exists(),
        **_nav(request),
    })
