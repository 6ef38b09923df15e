"""Review template tags.

``{% review_panel session %}`` renders the review gates of one session (state, route, frozen
fingerprints, assignments and the bound verdicts) for the manager's session page.
``shortfp`` shows a fingerprint as ``sha256:3f2a…9c1d``.
"""
from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Prefetch
from django.utils.translation import gettext, gettext_lazy

from novelforge_sessions.counting import count_up_to
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from reviews.packets import DECISION_LABELS, confidence_words

register = template.Library()


@register.filter
def shortfp(value: str | None) -> str:
    if not value:
        return ""
    algo, _, digest = str(value).partition(":")
    if not digest or len(digest) <= 12:
        return str(value)
    return f"{algo}:{digest[:4]}…{digest[-4:]}"


#: A finding's severity in the page's language (the code stays in classes and the form's values).
SEVERITY_LABELS = {"minor": gettext_lazy("minor"), "major": gettext_lazy("major"), "critical": gettext_lazy("critical")}


@register.filter
def severity_label(value: str | None) -> str:
    return str(SEVERITY_LABELS.get(value or "", value or ""))


#: Where a verdict came from (``Verdict.Channel``), as a page says it: "bound via the reviewer page"; the
#: code stays in the API's ``channel`` and the element's ``data-channel``.
CHANNEL_LABELS = {
    Verdict.Channel.PAGE: gettext_lazy("the reviewer page"),
    Verdict.Channel.RELAY: gettext_lazy("another chat's reply"),
    Verdict.Channel.API: gettext_lazy("an agent reviewer"),
}


@register.filter
def channel_label(value: str | None) -> str:
    return str(CHANNEL_LABELS.get(value or "", value or ""))


@register.filter
def get_item(mapping: dict | None, key: str) -> Any:
    return (mapping or {}).get(key, "")


@register.filter
def packet_gist(packet) -> dict[str, Any]:
    """What a queue row says is to be read, from the stored packet only (the reviewer's whole
    world): how many lines, how the text opens, what it is scored on."""
    content = packet.content or {}
    text = (content.get("candidate") or {}).get("content", "")
    opening = next((line.strip() for line in text.splitlines() if line.strip()), "")
    criteria = [c.get("label") or c.get("key") for c in (content.get("rubric") or {}).get("criteria", [])]
    return {"lines": len(text.splitlines()), "opening": opening, "criteria": ", ".join(map(str, criteria))}


@register.filter
def decision_label(value: str | None) -> str:
    """A decision in the verdict form's own words ("Needs revision" for ``revise``)."""
    return str(DECISION_LABELS.get(value or "", value or ""))


@register.filter
def confidence_label(value: float | None) -> str:
    """A confidence in the verdict form's own words: the nearest of its choices ("Sure" for 0.75)."""
    return confidence_words(value)


def _reviewer_name(assignment: ReviewAssignment) -> str:
    if assignment.reviewer_user is not None:
        return assignment.reviewer_user.get_username()
    if assignment.reviewer_session_id is not None:
        return gettext("agent session #%(id)s") % {"id": assignment.reviewer_session_id}
    return assignment.reviewer or gettext("unclaimed")


#: Gates the session page's review panel shows, newest first; it counts the rest (up to
#: ``counting.COUNT_CAP``) and says how many it shows of how many.
PANEL_GATES = 20


@register.inclusion_tag("reviews/_session_panel.html")
def review_panel(session) -> dict[str, Any]:
    """The newest ``PANEL_GATES`` review gates of one session, for the manager's session page
    (read from the (session, id) index: a session may have opened thousands)."""
    of_session = ReviewGate.objects.filter(session_id__any=[session.id])
    gates = list(
        of_session.select_related("packet", "candidate__artifact", "run")
        .prefetch_related(
            Prefetch(
                "packet__assignments",
                queryset=ReviewAssignment.objects.select_related("reviewer_user").order_by("id"),
            ),
            Prefetch("packet__verdicts", queryset=Verdict.objects.order_by("id")),
        )
        .order_by("-session_id", "-id")[:PANEL_GATES]
    )
    total = len(gates) if len(gates) < PANEL_GATES else count_up_to(of_session, order=("-session_id", "-id"))
    items = []
    for gate in gates:
        by_assignment = {v.assignment_id: v for v in gate.packet.verdicts.all()}
        criteria = gate.rubric.get("criteria", [])
        rows = []
        for a in gate.packet.assignments.all():
            verdict = by_assignment.get(a.id)
            # Scores in rubric order (jsonb does not keep key order).
            scores = [(c["key"], verdict.scores.get(c["key"]), c["scale"]["max"]) for c in criteria] if verdict else []
            rows.append({"a": a, "reviewer": _reviewer_name(a), "v": verdict, "scores": scores})
        items.append(
            {
                "gate": gate,
                "artifact": gate.candidate.artifact.name,
                "version": gate.candidate.number,
                "rows": rows,
                "live_agents": (gate.routing or {}).get("live_agent_reviewers", []),
            }
        )
    return {"session": session, "gates": items, "total": total}
