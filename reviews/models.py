"""Review gates, bounded blind packets, assignments and typed verdicts (docs/model.md#reviews-and-independence).

Four records, kept apart on purpose:

* :class:`ReviewGate` — what the writer's run froze: the candidate (an immutable artifact
  version and its server fingerprint), a typed rubric, the declared evidence, the route and
  how many verdicts it needs. The gate belongs to the writer's session and run.
* :class:`GateCalibration` — hidden calibration material (expected verdict, answer key) in
  its own table. Only the calibration scoring reads it; the packet builder never receives it.
* :class:`ReviewPacket` — the bounded blind packet, built once by ``packets.build_packet`` from
  an explicit allowlist and stored frozen with its own fingerprint.
* :class:`ReviewAssignment` / :class:`Verdict` — who may review the packet (a human reviewer or
  an agent reviewer session) and what each bound. One verdict per reviewer per packet is a
  database rule, not a convention.

Reviewer identities are keys like ``user:<id>`` or ``session:<id>``: stable execution
identities that outlive a renamed user or a forgotten reviewer session.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.lifecycles import AssignmentState, GateState
from novelforge_sessions.models import ArtifactVersion, Project, Run, Session, text_choices
from novelforge_sessions.session_runtime import FINGERPRINT_PATTERN
from reviews.packets import DECISIONS, ROUTES


def _enum(field: str, values) -> Q:
    return Q(**{f"{field}__in": [str(v) for v in values]})


class ReviewGate(models.Model):
    class Route(models.TextChoices):
        PAGE = "page"  # a human reviewer's page
        RELAY = "relay"  # a human relays the packet to another chat and pastes its answer back
        AGENT = "agent"  # an agent reviewer session claims it through the API

    #: Declared in the pure core (``lifecycles.REVIEW_GATE``); these are its Django choices.
    State = text_choices("State", GateState)

    #: Routes that wait on a person: the session is ``awaiting_user`` while one is pending.
    USER_ROUTES = frozenset({Route.PAGE.value, Route.RELAY.value})

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_gates")
    # Indexed by ``review_gate_session`` (session, id) and ``review_gate_session_state``: a plain
    # one on session alone let the planner read all of a session's gates to sort them by id.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="review_gates", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="review_gates")
    opened_by = models.CharField(max_length=200)
    candidate = models.ForeignKey(ArtifactVersion, on_delete=models.PROTECT, related_name="review_gates")
    candidate_fingerprint = models.CharField(max_length=71)
    # The artifact's current version when the candidate was frozen: if the artifact's head
    # moves to anything other than this or the candidate, the review is stale.
    head_version_id = models.BigIntegerField(null=True, blank=True)
    rubric = models.JSONField()
    evidence = models.JSONField(default=list, blank=True)
    route = models.CharField(max_length=8, choices=Route.choices)
    required_verdicts = models.PositiveSmallIntegerField(default=1)
    bound_verdicts = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    outcome = models.CharField(max_length=8, blank=True, default="")
    # What routing saw when the gate was opened (live agent reviewers that could have taken it).
    routing = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["session", "state"], name="review_gate_session_state"),
            # The session page: its newest gates (the review panel, the timeline's flags) in id order.
            models.Index(fields=["session", "id"], name="review_gate_session"),
        ]
        constraints = [
            models.CheckConstraint(condition=_enum("route", ROUTES), name="review_gate_route_enum"),
            models.CheckConstraint(condition=_enum("state", GateState), name="review_gate_state_enum"),
            models.CheckConstraint(condition=_enum("outcome", ["", *DECISIONS]), name="review_gate_outcome_enum"),
            models.CheckConstraint(condition=Q(required_verdicts__gte=1), name="review_gate_needs_a_verdict"),
            models.CheckConstraint(condition=Q(candidate_fingerprint__regex=FINGERPRINT_PATTERN), name="review_gate_candidate_fp_format"),
            # A complete gate has an outcome; a pending one has none yet.
            models.CheckConstraint(
                condition=(Q(state=GateState.COMPLETE) & ~Q(outcome="")) | (~Q(state=GateState.COMPLETE) & Q(outcome="")),
                name="review_gate_outcome_iff_complete",
            ),
        ]

    def __str__(self) -> str:
        return f"review gate {self.pk} ({self.route}, {self.state})"

    @property
    def waits_on_user(self) -> bool:
        return self.route in self.USER_ROUTES


class GateCalibration(models.Model):
    """Hidden calibration material: an expected verdict and an answer key.

    Read only by the calibration scoring for managers. Never passed to ``packets.build_packet``,
    never rendered for reviewers, never in an event (no hidden expected verdicts,
    no regression answer keys in an independent reviewer's context).
    """

    gate = models.OneToOneField(ReviewGate, on_delete=models.CASCADE, related_name="calibration")
    expected_decision = models.CharField(max_length=8, blank=True, default="")
    expected_scores = models.JSONField(default=dict, blank=True)
    answer_key = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=_enum("expected_decision", ["", *DECISIONS]), name="calibration_decision_enum"),
        ]


class ReviewPacket(models.Model):
    """The frozen blind packet. ``content`` is exactly what ``packets.build_packet`` returned;
    ``fingerprint`` is the sha256 of its canonical JSON. Never edited after creation."""

    gate = models.OneToOneField(ReviewGate, on_delete=models.CASCADE, related_name="packet")
    fingerprint = models.CharField(max_length=71, db_index=True)
    content = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(fingerprint__regex=FINGERPRINT_PATTERN), name="review_packet_fp_format"),
        ]

    def __str__(self) -> str:
        return f"review packet {self.pk}"


class ReviewAssignment(models.Model):
    """One reviewer slot on a packet.

    Human routes create one ``assigned`` row per named reviewer. The agent route creates one
    row per required verdict, each with its control-plane :class:`Handoff` (lease, fencing
    token, attempts): pre-assigned to a reviewer session, or ``open`` until an agent reviewer
    claims the handoff (``actions.claim_packet``). A claim whose lease expired moves the slot
    to the next eligible reviewer.
    """

    #: Declared in the pure core (``lifecycles.REVIEW_ASSIGNMENT``): open (an unclaimed agent
    #: slot), assigned, submitted.
    State = text_choices("State", AssignmentState)

    packet = models.ForeignKey(ReviewPacket, on_delete=models.CASCADE, related_name="assignments")
    reviewer = models.CharField(max_length=64, blank=True, default="")  # "user:<id>" | "session:<id>" | "" (open)
    reviewer_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="review_assignments"
    )
    reviewer_session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="review_assignments"
    )
    # Agent route only: the handoff this slot is claimed and leased through.
    handoff = models.OneToOneField(
        Handoff, null=True, blank=True, on_delete=models.SET_NULL, related_name="review_assignment"
    )
    state = models.CharField(max_length=12, choices=State.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    assigned_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["reviewer", "state", "id"], name="review_assignment_queue"),
            # The reviewer's queue page: "To review" oldest assigned first, "Submitted" newest
            # first, each read in its order from the index (a reviewer may hold thousands).
            models.Index(fields=["reviewer", "assigned_at", "id"], condition=Q(state=AssignmentState.ASSIGNED),
                         name="review_assignment_waiting"),
            models.Index(fields=["reviewer", "submitted_at", "id"], condition=Q(state=AssignmentState.SUBMITTED),
                         name="review_assignment_submitted"),
            models.Index(fields=["id"], condition=Q(state=AssignmentState.OPEN), name="review_assignment_open"),
        ]
        constraints = [
            models.CheckConstraint(condition=_enum("state", AssignmentState), name="review_assignment_state_enum"),
            # Open exactly when nobody holds the slot.
            models.CheckConstraint(
                condition=(Q(state=AssignmentState.OPEN) & Q(reviewer="")) | (~Q(state=AssignmentState.OPEN) & ~Q(reviewer="")),
                name="review_assignment_open_iff_unclaimed",
            ),
            # A reviewer holds at most one slot per packet (their verdict is one verdict).
            models.UniqueConstraint(
                fields=["packet", "reviewer"], condition=~Q(reviewer=""), name="review_assignment_one_per_reviewer"
            ),
        ]


class Verdict(models.Model):
    """A typed verdict bound to the packet and artifact fingerprints it cites. Immutable."""

    class Channel(models.TextChoices):
        PAGE = "page"  # the reviewer page's form
        RELAY = "relay"  # pasted back from another chat
        API = "api"  # an agent reviewer session

    packet = models.ForeignKey(ReviewPacket, on_delete=models.CASCADE, related_name="verdicts")
    assignment = models.OneToOneField(ReviewAssignment, on_delete=models.CASCADE, related_name="verdict")
    reviewer = models.CharField(max_length=64)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    decision = models.CharField(max_length=8)
    scores = models.JSONField()
    findings = models.JSONField(default=list, blank=True)
    confidence = models.FloatField()
    packet_fingerprint = models.CharField(max_length=71)
    artifact_fingerprint = models.CharField(max_length=71)
    # sha256 of the verdict's canonical JSON: an identical resubmission has the same one.
    fingerprint = models.CharField(max_length=71)
    bound_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # docs/model.md#reviews-and-independence: a second, different verdict from the same reviewer on the
            # same packet is refused — here, by the database.
            models.UniqueConstraint(fields=["packet", "reviewer"], name="verdict_one_per_reviewer_per_packet"),
            models.CheckConstraint(condition=_enum("decision", DECISIONS), name="verdict_decision_enum"),
            models.CheckConstraint(condition=_enum("channel", ["page", "relay", "api"]), name="verdict_channel_enum"),
            models.CheckConstraint(condition=Q(confidence__gte=0) & Q(confidence__lte=1), name="verdict_confidence_range"),
            models.CheckConstraint(condition=Q(packet_fingerprint__regex=FINGERPRINT_PATTERN), name="verdict_packet_fp_format"),
            models.CheckConstraint(condition=Q(artifact_fingerprint__regex=FINGERPRINT_PATTERN), name="verdict_artifact_fp_format"),
        ]

    def __str__(self) -> str:
        return f"verdict {self.pk} ({self.decision})"
