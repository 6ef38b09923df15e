"""Control-plane records (docs/model.md#the-control-plane).

Four distinct records for one external result, never merged:

    ResultDelivery  (every arrival, logged)
  ≠ ResultValidation (schema + bound to the frozen job's fingerprint)
  ≠ ConsumeReceipt  (at most one per logical id: a DB unique constraint)
  ≠ WriteIntent     (the side effect, with before-state, idempotency key, approval, post-condition)

Statuses here, like the session's, are only written by the actions in
``novelforge_sessions/actions`` (``handoffs``, ``results``, ``intents``).
"""
from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from novelforge_sessions import event_types as ev
from novelforge_sessions import lifecycles as lc
from novelforge_sessions.models import Artifact, ArtifactVersion, Checkpoint, Project, Run, Session, text_choices
from novelforge_sessions.session_runtime import FINGERPRINT_PATTERN


#: ``lifecycles.HANDOFF``: pending, claimed, bound, conflicted, cancelled.
HandoffState = text_choices("HandoffState", lc.HandoffState)


#: Handoffs still waiting for a result (``lifecycles.HANDOFF_WAITING``).
UNBOUND_STATES = tuple(s.value for s in lc.HANDOFF_WAITING)
#: Handoffs that still need attention: waiting, or a conflict nobody resolved yet
#: (``lifecycles.conflict_open``: resolving moves it back to bound). The session page's
#: "Pending handoffs" panel lists these, from the ``handoff_session_open`` index.
OPEN_STATES = (*UNBOUND_STATES, lc.HandoffState.CONFLICTED.value)


class HandoffPurpose(models.TextChoices):
    """What a handoff is for, and so which routes may touch it (docs/model.md#handoffs).

    ``job``: a frozen job for any worker with the ``work`` permission (``/handoffs/…``).
    ``review``: an agent-review slot (``reviews``): claimed, renewed and answered only
    through the review routes (``/review-packets/…``), by an eligible independent reviewer,
    with a typed verdict; the plain routes refuse it with 409 ``review_route_required``.
    """

    JOB = "job"
    REVIEW = "review"


#: The handoffs with inputs: the condition of their partial GIN index (``access.given_to``,
#: which spells it out, as the core may not import the control plane).
CITES_INPUTS = ~Q(inputs=[])


#: When a handoff finished, as the session page orders its finished ones (newest first, from the
#: ``handoff_session_finished`` index: the same expression, so the page reads only what it shows).
HANDOFF_FINISHED_AT = Coalesce("conflict_resolved_at", "bound_at", "cancelled_at", "created_at")


class Handoff(models.Model):
    """A frozen job handed to an external worker (docs/model.md#handoffs): logical id, job fingerprint,
    required capabilities, lease, attempts."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="handoffs")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="handoffs")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="handoffs")
    logical_id = models.CharField(max_length=200)
    #: frozen input refs: [{"artifact_id", "fingerprint"}], sorted
    inputs = models.JSONField(default=list)
    #: the job's instructions (bounded); part of the frozen job
    params = models.JSONField(default=dict, blank=True)
    #: required result keys and their JSON types: {"text": "string", ...}
    result_schema = models.JSONField(default=dict, blank=True)
    #: server-computed sha256 over the frozen inputs (+ params, result schema)
    job_fingerprint = models.CharField(max_length=71)
    required_capabilities = models.JSONField(default=list, blank=True)
    #: how long one attempt's lease lasts without a heartbeat
    timeout_seconds = models.PositiveIntegerField()
    #: job (plain handoff routes) or review (only the review routes); fixed at creation
    purpose = models.CharField(max_length=16, choices=HandoffPurpose.choices, default=HandoffPurpose.JOB)
    state = models.CharField(max_length=16, choices=HandoffState.choices, default=HandoffState.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    fencing_token = models.PositiveBigIntegerField(default=0)
    lease_holder = models.CharField(max_length=200, blank=True, default="")
    lease_token_id = models.BigIntegerField(null=True, blank=True)  # the API token that claimed (audit only)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    bound_at = models.DateTimeField(null=True, blank=True)
    conflict_at = models.DateTimeField(null=True, blank=True)
    conflict_resolved_at = models.DateTimeField(null=True, blank=True)
    conflict_resolution = models.CharField(max_length=200, blank=True, default="")
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The claim query scans a project's claimable handoffs in id order; the charts count
            # them and read their creation times from the index alone (``include``).
            models.Index(fields=["project", "id"], include=["created_at"], condition=Q(state__in=UNBOUND_STATES),
                         name="handoff_claimable"),
            # One session's handoffs of one state in id order (``GET /handoffs?session_id=&state=``,
            # the conflicts panel), without walking the primary key.
            models.Index(fields=["session", "state", "id"], name="handoff_session_state"),
            # The session page's open handoffs in id order, counted and charted from the index alone
            # (a session may hold half a million finished ones).
            models.Index(fields=["session", "id"], include=["state", "created_at"], condition=Q(state__in=OPEN_STATES),
                         name="handoff_session_open"),
            models.Index(F("session"), HANDOFF_FINISHED_AT.desc(), F("id").desc(), name="handoff_session_finished"),
            GinIndex(fields=["inputs"], opclasses=["jsonb_path_ops"], condition=CITES_INPUTS, name="handoff_cites_inputs"),
        ]
        constraints = [
            # A logical id names one logical job per project, so its
            # result can be recognised (duplicate) or refused (conflict) on every later arrival.
            models.UniqueConstraint(fields=["project", "logical_id"], name="handoff_logical_id_unique_per_project"),
            # Statuses only from the declared set (no free-form state: docs/model.md#record-lifecycles).
            models.CheckConstraint(condition=Q(state__in=HandoffState.values), name="handoff_state_enum"),
            # Which routes may touch it: only the declared purposes.
            models.CheckConstraint(condition=Q(purpose__in=HandoffPurpose.values), name="handoff_purpose_enum"),
            # A job is identified by a server-computed content address (the job fingerprint).
            models.CheckConstraint(condition=Q(job_fingerprint__regex=FINGERPRINT_PATTERN), name="handoff_job_fp_format"),
            # A lease is only ever held with a holder, an expiry and a fencing token ≥ 1.
            models.CheckConstraint(
                condition=~Q(state=lc.HandoffState.CLAIMED) | (Q(lease_expires_at__isnull=False) & Q(fencing_token__gte=1)),
                name="handoff_claimed_has_lease",
            ),
            # The fencing token advances with every claim: never behind the attempt count.
            models.CheckConstraint(condition=Q(fencing_token__gte=models.F("attempt")), name="handoff_token_tracks_attempts"),
            # Bound/conflicted handoffs carry the time their result was bound (a receipt exists).
            models.CheckConstraint(
                condition=~Q(state__in=[lc.HandoffState.BOUND.value, lc.HandoffState.CONFLICTED.value]) | Q(bound_at__isnull=False),
                name="handoff_bound_has_time",
            ),
            # Every attempt's lease ends (an expired lease is what makes a job re-claimable).
            models.CheckConstraint(condition=Q(timeout_seconds__gte=1), name="handoff_timeout_positive"),
        ]

    def __str__(self) -> str:
        return f"handoff {self.logical_id} ({self.state})"


class DeliveryOutcome(models.TextChoices):
    CONSUMED = "consumed"  # this arrival was validated and consumed (the receipt points at it)
    ALREADY_CONSUMED = "already_consumed"  # same logical id, same hash: recognised duplicate
    CONFLICTING_RESULT = "conflicting_result"  # same logical id, different hash: hard stop
    STALE_LEASE = "stale_lease"  # carried a superseded fencing token
    INVALID = "invalid"  # failed validation (schema, or does not cite the frozen job)
    NOT_CLAIMABLE = "not_claimable"  # the handoff was never claimed, or was cancelled


class ResultDelivery(models.Model):
    """Every arrival of a result, whatever became of it (the delivery log)."""

    handoff = models.ForeignKey(Handoff, on_delete=models.CASCADE, related_name="deliveries")
    attempt = models.PositiveIntegerField()
    fencing_token = models.PositiveBigIntegerField()
    result_hash = models.CharField(max_length=71)
    #: kept for arrivals that were examined (consumed, conflicting, invalid); a recognised
    #: duplicate stores only its hash — it is byte-identical to the consumed payload.
    payload = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=24, choices=DeliveryOutcome.choices)
    delivered_by = models.CharField(max_length=200, default="")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["handoff", "id"], name="delivery_handoff_id")]
        constraints = [
            # Every arrival is classified by what became of it (docs/model.md#results-and-idempotent-delivery: delivery ≠ consumption).
            models.CheckConstraint(condition=Q(outcome__in=DeliveryOutcome.values), name="delivery_outcome_enum"),
            # The hash is the server's sha256 of the canonical result: the identity duplicates are recognised by.
            models.CheckConstraint(condition=Q(result_hash__regex=FINGERPRINT_PATTERN), name="delivery_hash_format"),
        ]


class ResultValidation(models.Model):
    """The validation of one (non-duplicate) delivery: schema, and bound to the frozen job."""

    delivery = models.OneToOneField(ResultDelivery, on_delete=models.CASCADE, related_name="validation")
    valid = models.BooleanField()
    cites_job_fingerprint = models.BooleanField()
    stated_job_fingerprint = models.CharField(max_length=80, blank=True, default="")
    errors = models.JSONField(default=list, blank=True)
    validated_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # A result that does not cite the frozen job can never be valid (docs/model.md#stop-conditions).
            models.CheckConstraint(condition=~Q(valid=True) | Q(cites_job_fingerprint=True), name="validation_valid_cites_job"),
        ]


class ConsumeReceipt(models.Model):
    """Proof that a logical result was consumed — once.

    Outlives its handoff (``handoff`` is SET_NULL when a session is forgotten), so a consumed
    logical id can never be consumed again, even through a new handoff.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="receipts")
    logical_id = models.CharField(max_length=200)
    handoff = models.OneToOneField(Handoff, null=True, blank=True, on_delete=models.SET_NULL, related_name="receipt")
    session_id = models.BigIntegerField(null=True, blank=True)  # plain column: outlives the session
    run_id = models.BigIntegerField(null=True, blank=True)
    delivery = models.ForeignKey(ResultDelivery, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    job_fingerprint = models.CharField(max_length=71)
    result_hash = models.CharField(max_length=71)
    result = models.JSONField()
    consumed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # A logical result is consumed at most once (docs/model.md#results-and-idempotent-delivery). Concurrent
            # deliveries race on this index; exactly one insert wins.
            models.UniqueConstraint(fields=["project", "logical_id"], name="receipt_one_per_logical_id"),
            # A same-hash arrival is a duplicate, any other hash a conflict: the hash must be exact.
            models.CheckConstraint(condition=Q(result_hash__regex=FINGERPRINT_PATTERN), name="receipt_hash_format"),
        ]


class IntentKind(models.TextChoices):
    ARTIFACT_MAKE_CURRENT = "artifact.make_current"
    AUTHORITY_SETTLE = "authority.settle"
    FRAMEWORK_CHANGE = "framework.change"


#: The catalog event each executed intent kind emits after ``write_intent.executed`` (readers
#: such as the project page's authority history select them by ``event_types.AUTHORITY_HISTORY``).
INTENT_EXECUTED_EVENTS: dict[IntentKind, ev.EventType] = {
    IntentKind.ARTIFACT_MAKE_CURRENT: ev.ARTIFACT_CURRENT_CHANGED,
    IntentKind.AUTHORITY_SETTLE: ev.AUTHORITY_SETTLED,
    IntentKind.FRAMEWORK_CHANGE: ev.FRAMEWORK_CHANGED,
}


#: ``lifecycles.WRITE_INTENT``: proposed, approved, rejected, executed, refused (a stale
#: before-state at execution: terminal).
IntentState = text_choices("IntentState", lc.IntentState)


class WriteIntent(models.Model):
    """A consequential write (docs/model.md#write-intents-and-authority): before-state, idempotency key, approval,
    compare-and-swap execution and a recorded post-condition. Session state, role and
    provider metadata play no part in whether it may execute."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="write_intents")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="write_intents")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=32, choices=IntentKind.choices)
    artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    params = models.JSONField(default=dict, blank=True)
    before_fingerprint = models.CharField(max_length=71)
    before_state = models.JSONField()
    idempotency_key = models.CharField(max_length=200)
    #: sha256 of (kind, target, params, before-state): a reused key with another request is refused
    request_fingerprint = models.CharField(max_length=71)
    state = models.CharField(max_length=16, choices=IntentState.choices, default=IntentState.PROPOSED)
    #: the first outcome, returned verbatim to every replay
    outcome = models.JSONField(null=True, blank=True)
    after_fingerprint = models.CharField(max_length=71, blank=True, default="")
    #: {"expected": fp, "observed": fp, "ok": bool}: checked after the write, recorded here
    postcondition = models.JSONField(null=True, blank=True)
    refusal_code = models.CharField(max_length=32, blank=True, default="")
    executed_at = models.DateTimeField(null=True, blank=True)
    executed_by = models.CharField(max_length=200, blank=True, default="")
    created_by = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["project", "state", "id"], name="intent_project_state")]
        constraints = [
            # Replaying an idempotency key returns the first outcome; the key
            # names one intent per project.
            models.UniqueConstraint(fields=["project", "idempotency_key"], name="intent_idempotency_key_unique"),
            # Only the consequential writes the service knows how to compare-and-swap.
            models.CheckConstraint(condition=Q(kind__in=IntentKind.values), name="intent_kind_enum"),
            models.CheckConstraint(condition=Q(state__in=IntentState.values), name="intent_state_enum"),
            # Every consequential write names the before-state it expects.
            models.CheckConstraint(condition=Q(before_fingerprint__regex=FINGERPRINT_PATTERN), name="intent_before_fp_format"),
            # An artifact write names its artifact; an authority write names none.
            models.CheckConstraint(
                condition=(Q(kind="artifact.make_current") & Q(artifact__isnull=False))
                | (~Q(kind="artifact.make_current") & Q(artifact__isnull=True)),
                name="intent_target_matches_kind",
            ),
            # Executed ⇔ a recorded post-condition and an execution time.
            models.CheckConstraint(
                condition=~Q(state=lc.IntentState.EXECUTED) | (Q(postcondition__isnull=False) & Q(executed_at__isnull=False)),
                name="intent_executed_has_postcondition",
            ),
        ]


class ApprovalDecision(models.TextChoices):
    APPROVED = "approved"
    REJECTED = "rejected"


class Approval(models.Model):
    """A manager's decision on a write intent, bound to the before-state and authority it saw.

    It goes stale when revoked, or when the project's authority moved since it was given.
    """

    intent = models.ForeignKey(WriteIntent, on_delete=models.CASCADE, related_name="approvals")
    decision = models.CharField(max_length=16, choices=ApprovalDecision.choices)
    approver = models.CharField(max_length=200)
    approver_token_id = models.BigIntegerField(null=True, blank=True)
    approver_user_id = models.BigIntegerField(null=True, blank=True)
    before_fingerprint = models.CharField(max_length=71)
    authority_version = models.PositiveIntegerField()
    note = models.CharField(max_length=500, blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(decision__in=ApprovalDecision.values), name="approval_decision_enum"),
            # Write authority comes from one standing manager decision, never from two
            # contradictory ones (nor from the session).
            models.UniqueConstraint(fields=["intent"], condition=Q(revoked_at__isnull=True), name="approval_one_standing_per_intent"),
        ]


class AuthorityChange(models.Model):
    """History of the project's authority/framework: what each executed intent changed."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="authority_changes")
    intent = models.OneToOneField(WriteIntent, on_delete=models.CASCADE, related_name="authority_change")
    kind = models.CharField(max_length=32, choices=IntentKind.choices)
    before = models.JSONField()
    after = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Only authority/framework writes change what sessions are bound to (binding invalidation).
            models.CheckConstraint(
                condition=Q(kind__in=[IntentKind.AUTHORITY_SETTLE.value, IntentKind.FRAMEWORK_CHANGE.value]),
                name="authority_change_kind",
            ),
        ]


# ---- graph threads (LangGraph checkpointer) ----------------------------------------------------
class GraphThread(models.Model):
    """A graph runtime's thread (LangGraph ``thread_id``) and the session that is its durable identity.

    The thread id is provider-native metadata (docs/model.md#identities): it names the session, never grants
    anything. Forgetting the session (``delete_thread``) deletes this row with it.
    """

    # No index of its own: ``graph_thread_unique_per_project`` (project, thread_id) serves it.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="graph_threads", db_index=False)
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="graph_thread")
    #: ``control/graphs.MAX_PATH_LENGTH`` (so are the namespaces and task paths below)
    thread_id = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # One session per thread id in a project: two writers opening the same new thread race on
        # this constraint, and the loser reads the winner's session.
        constraints = [models.UniqueConstraint(fields=["project", "thread_id"], name="graph_thread_unique_per_project")]


class GraphCheckpoint(models.Model):
    """The graph's index of one bounded :class:`Checkpoint`: its graph ids, namespace and metadata.

    The checkpoint itself holds only a cursor and the fingerprints of the state blobs (artifacts
    named by their content fingerprint); ``document`` is the graph's own bookkeeping (channel
    versions, versions seen, the channel → blob fingerprint map), without any channel value.
    """

    # No index of its own: ``graph_cp_unique_id`` (thread, …) serves it.
    thread = models.ForeignKey(GraphThread, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    record = models.OneToOneField(Checkpoint, on_delete=models.CASCADE, related_name="graph")
    checkpoint_ns = models.CharField(max_length=1000, blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    parent_checkpoint_id = models.CharField(max_length=64, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    document = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # A graph checkpoint id names one checkpoint of its thread and namespace: a retried put
        # finds the first one (idempotent), a different body under the same id is a conflict.
        constraints = [
            models.UniqueConstraint(fields=["thread", "checkpoint_ns", "checkpoint_id"], name="graph_cp_unique_id"),
        ]
        # ``delete_for_runs`` finds a run's checkpoints by the run id LangGraph puts in their metadata.
        indexes = [models.Index(KT("metadata__run_id"), name="graph_cp_run_id")]


class GraphBlob(models.Model):
    """Which content a channel had at a version of a thread's namespace (a blob fingerprint).

    A checkpoint names every channel's version; only channels that changed bring a new blob,
    the others are found here (LangGraph's incremental channel updates).
    """

    # No index of its own: ``graph_blob_unique_version`` (thread, …) serves it.
    thread = models.ForeignKey(GraphThread, on_delete=models.CASCADE, related_name="blobs", db_index=False)
    checkpoint_ns = models.CharField(max_length=1000, blank=True, default="")
    channel = models.CharField(max_length=200)
    version = models.CharField(max_length=100, help_text="the channel version, as JSON")
    fingerprint = models.CharField(max_length=71)

    class Meta:
        # Garbage collection asks whether any thread still maps a fingerprint (``control/graph_gc.py``).
        indexes = [models.Index(fields=["fingerprint"], name="graph_blob_fingerprint")]
        constraints = [
            models.UniqueConstraint(fields=["thread", "checkpoint_ns", "channel", "version"], name="graph_blob_unique_version"),
            models.CheckConstraint(condition=Q(fingerprint__regex=FINGERPRINT_PATTERN), name="graph_blob_fp_format"),
        ]


class GraphWrite(models.Model):
    """A pending write of a graph task against one checkpoint (LangGraph ``put_writes``).

    Checkpoints are immutable, so pending writes live beside them, keyed by the graph checkpoint
    id (a graph may store a task's writes before the checkpoint they follow has landed); the value
    is a content-addressed blob artifact like the state, or, when it is a small JSON scalar
    (``control/graphs.MAX_INLINE_*``: ``None``, a boolean, a small integer, a short string), its
    JSON text in the row itself (``scalar``): no blob to store, look up or lock. Exactly one of the
    two. ``(checkpoint, task_id, idx)`` is unique: a repeated write is stored once.
    """

    # No index of its own: ``graph_write_unique_idx`` (thread, …) serves it.
    thread = models.ForeignKey(GraphThread, on_delete=models.CASCADE, related_name="writes", db_index=False)
    checkpoint_ns = models.CharField(max_length=1000, blank=True, default="")
    checkpoint_id = models.CharField(max_length=64)
    task_id = models.CharField(max_length=64)
    task_path = models.CharField(max_length=1000, blank=True, default="")
    idx = models.IntegerField()
    channel = models.CharField(max_length=200)
    value = models.ForeignKey(ArtifactVersion, on_delete=models.PROTECT, related_name="+", null=True)
    #: the value's compact JSON text when it is stored inline (then ``value`` is NULL)
    scalar = models.TextField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task_id", "idx"]
        constraints = [
            models.UniqueConstraint(fields=["thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                                    name="graph_write_unique_idx"),
            models.CheckConstraint(condition=Q(value__isnull=True) ^ Q(scalar__isnull=True),
                                   name="graph_write_blob_or_scalar"),
        ]


class GraphBlobChunk(models.Model):
    """One chunk of a state blob being uploaded (``POST /graph-blobs``), staged until the last arrives.

    A value larger than one request body travels in chunks; the blob itself (the artifact named
    by its fingerprint) is written only when every chunk is here and their content hashes to the
    fingerprint, in the transaction that removes the staged chunks. A chunk is never read as state.
    """

    # No index of its own: ``graph_blob_chunk_unique_index`` (project, …) serves it.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    fingerprint = models.CharField(max_length=71)
    serde = models.CharField(max_length=64)
    index = models.IntegerField()
    count = models.IntegerField()
    data = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "fingerprint", "index"], name="graph_blob_chunk_unique_index"),
        ]


__all__ = [
    "INTENT_EXECUTED_EVENTS",
    "Approval", "ApprovalDecision", "AuthorityChange", "ConsumeReceipt", "DeliveryOutcome",
    "GraphBlob", "GraphBlobChunk", "GraphCheckpoint", "GraphThread", "GraphWrite",
    "Handoff", "HandoffPurpose", "HandoffState", "IntentKind", "IntentState", "ResultDelivery", "ResultValidation", "WriteIntent",
    "UNBOUND_STATES",
]
