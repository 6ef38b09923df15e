"""Durable records of the Session Runtime (docs/model.md#identities).

Identities are kept apart on purpose: a Project is not a Session, a
Session is not a Run, a Run is not a Checkpoint. Provider-native ids live in
``provider_metadata`` JSON and nothing keys on them: they are metadata, never authority.

Statuses are never assigned directly: every status write goes through
``lifecycles.SESSION.check`` inside an action (``novelforge_sessions/actions``).
The database enforces what it can: enums, one live runtime and one open run per session,
unique sequence numbers.
"""
from __future__ import annotations

import hashlib

from datetime import datetime

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q
from django.utils import timezone

from novelforge_sessions import leases
from novelforge_sessions import session_runtime as rt


def _choices(enum: type) -> list[tuple[str, str]]:
    return [(m.value, m.value) for m in enum]


def text_choices(name: str, enum: type) -> type[models.TextChoices]:
    """Django choices for a state enum declared in the pure core (``lifecycles``): one
    declaration, no copies (used by the control plane's and the reviews' models)."""
    return models.TextChoices(name, [(m.name, m.value) for m in enum])


#: The checkpoints that cite artifacts: the condition of the partial GIN index a bound token's
#: citation check probes (``access.given_to``; ``control.models.CITES_INPUTS`` for handoffs).
#: Most checkpoints cite nothing, and their writes never touch the index.
CITES_ARTIFACTS = ~Q(artifacts=[])


def _in_enum(field: str, enum: type) -> Q:
    return Q(**{f"{field}__in": [m.value for m in enum]})


def content_fingerprint(content: bytes) -> str:
    """Server-computed content address of an artifact version: ``sha256:<hex>`` of its bytes."""
    return "sha256:" + hashlib.sha256(content).hexdigest()


class Project(models.Model):
    """The durable novel or framework being worked on; carries its authority (Canon) refs."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Authority: only an executed write intent changes these (docs/model.md#write-intents-and-authority).
    authority_version = models.PositiveIntegerField(default=1)
    lock_fingerprint = models.CharField(max_length=80, default="")
    framework_version = models.CharField(max_length=64, default="1")
    requires_write_approval = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.slug

    def authority_ref(self) -> dict:
        return {
            "authority_version": self.authority_version,
            "lock_fingerprint": self.lock_fingerprint,
            "framework_version": self.framework_version,
        }


class Membership(models.Model):
    """A human's role in a project: managers supervise, reviewers review (docs/model.md#access)."""

    class Role(models.TextChoices):
        MANAGER = "manager"
        REVIEWER = "reviewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project", "role"], name="membership_unique"),
            models.CheckConstraint(condition=Q(role__in=["manager", "reviewer"]), name="membership_role_enum"),
        ]


#: The kind of the graph's state blobs (``control/graphs.py``: one immutable version, named
#: ``blob:<its fingerprint>``), which garbage collection removes once nothing cites them
#: (``control/graph_gc.py``). Reserved: the artifacts API refuses to create an artifact of this
#: kind or to add a version to one, so every artifact of the kind is a blob the graph wrote.
GRAPH_BLOB_KIND = "graph-blob"


class Artifact(models.Model):
    # No index of its own: ``artifact_name_unique_per_project`` (project, name) serves every lookup
    # by project, the cascade included; a second index would only cost each insert.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=64, default="document")
    current_version = models.ForeignKey(
        "ArtifactVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="artifact_name_unique_per_project")]
        # Garbage collection walks the graph's blobs in id order (``control/graph_gc.py``),
        # never the project's other artifacts.
        indexes = [models.Index(fields=["id"], condition=Q(kind=GRAPH_BLOB_KIND), name="artifact_graph_blobs")]

    def __str__(self) -> str:
        return self.name


class ArtifactVersion(models.Model):
    """Immutable, content-addressed. Created once, never updated (no API or admin edits it)."""

    # No index of its own: ``artifact_version_number_unique`` (artifact, number) serves it.
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="versions", db_index=False)
    number = models.PositiveIntegerField()
    content = models.TextField()
    fingerprint = models.CharField(max_length=71)
    created_by = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["artifact_id", "number"]
        # Equality lookups only: no ``varchar_pattern_ops`` twin (what ``db_index=True`` adds).
        indexes = [models.Index(fields=["fingerprint"], name="artifact_version_fingerprint")]
        constraints = [
            models.UniqueConstraint(fields=["artifact", "number"], name="artifact_version_number_unique"),
            models.CheckConstraint(condition=Q(fingerprint__regex=rt.FINGERPRINT_PATTERN), name="artifact_version_fp_format"),
        ]


class Session(models.Model):
    """A resumable execution container (docs/model.md#identities). Role is responsibility, not authority."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sessions")
    role = models.CharField(max_length=32, choices=_choices(rt.SessionRole))
    role_extension = models.CharField(max_length=64, blank=True, default="")
    memory_policy = models.CharField(max_length=32, choices=_choices(rt.MemoryPolicy))
    task_mode = models.CharField(max_length=64)
    runtime_family = models.CharField(max_length=64)
    # Provider-native thread/conversation ids: metadata only, never a key.
    provider_metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=32, choices=_choices(rt.SessionStatus), default=rt.SessionStatus.CREATED.value)
    status_reason = models.CharField(max_length=200, blank=True, default="")
    # Bumped by every status change: the optimistic-concurrency token clients may send.
    version = models.PositiveIntegerField(default=1)
    # Last runtime generation handed out (docs/model.md#runtimes-and-leases).
    generation = models.PositiveIntegerField(default=0)
    run_count = models.PositiveIntegerField(default=0)
    transcript_length = models.PositiveIntegerField(default=0)
    # An open hard-stop flag (e.g. a conflicting result where the table forbids `failed`).
    open_conflict = models.CharField(max_length=200, blank=True, default="")
    created_by = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["project", "status", "id"], name="session_project_status"),
        ]
        constraints = [
            models.CheckConstraint(condition=_in_enum("status", rt.SessionStatus), name="session_status_enum"),
            models.CheckConstraint(condition=_in_enum("role", rt.SessionRole), name="session_role_enum"),
            models.CheckConstraint(condition=_in_enum("memory_policy", rt.MemoryPolicy), name="session_memory_policy_enum"),
            # role `other` only with an explicit extension name (docs/model.md#roles-and-memory-policies).
            models.CheckConstraint(
                condition=(Q(role="other") & ~Q(role_extension="")) | (~Q(role="other") & Q(role_extension="")),
                name="session_role_extension_only_for_other",
            ),
        ]

    def __str__(self) -> str:
        return f"session {self.pk} ({self.role}, {self.status})"


class RuntimeAttachmentQuerySet(models.QuerySet):
    """Liveness in SQL, the same rule as ``leases.runtime_is_live`` (docs/model.md#runtimes-and-leases)."""

    def live(self, now: datetime | None = None) -> RuntimeAttachmentQuerySet:
        """Live: the record says live and the lease has not run out."""
        return self.filter(state=rt.RuntimeState.LIVE, lease_expires_at__gt=now or timezone.now())

    def lease_expired(self, now: datetime | None = None) -> RuntimeAttachmentQuerySet:
        """The record says live but the lease ran out: gone, waiting to be tidied (``lost``)."""
        return self.filter(state=rt.RuntimeState.LIVE, lease_expires_at__lte=now or timezone.now())


class RuntimeAttachment(models.Model):
    """One live process/chat/worker serving a session for one generation (docs/model.md#runtimes-and-leases).

    ``state`` is the record; whether the runtime *is* live is derived from the lease
    (``live`` / ``lease_expired`` here, ``objects.live()`` in SQL).
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runtimes")
    generation = models.PositiveIntegerField()
    runtime_family = models.CharField(max_length=64)
    capabilities = models.JSONField(default=list, blank=True)
    provider_metadata = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=_choices(rt.RuntimeState), default=rt.RuntimeState.LIVE.value)
    lease_seconds = models.PositiveIntegerField()
    lease_expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    attached_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=64, blank=True, default="")

    objects = RuntimeAttachmentQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["lease_expires_at"], condition=Q(state=rt.RuntimeState.LIVE), name="runtime_live_lease"),
        ]
        constraints = [
            models.CheckConstraint(condition=_in_enum("state", rt.RuntimeState), name="runtime_state_enum"),
            # At most one live runtime per session: two executors never write one history.
            models.UniqueConstraint(fields=["session"], condition=Q(state=rt.RuntimeState.LIVE), name="one_live_runtime_per_session"),
            models.UniqueConstraint(fields=["session", "generation"], name="runtime_generation_unique"),
        ]

    @property
    def recorded_live(self) -> bool:
        """The record says live (its lease may have run out: then ``lease_expired``)."""
        return self.state == rt.RuntimeState.LIVE

    @property
    def live(self) -> bool:
        return leases.runtime_is_live(self.state, self.lease_expires_at, timezone.now())

    @property
    def lease_expired(self) -> bool:
        return leases.runtime_lease_expired(self.state, self.lease_expires_at, timezone.now())


#: The parameters of :func:`live_runtime_sql` besides ``now`` (state values are never SQL literals).
LIVE_RUNTIME_PARAMS = {"runtime_live_state": rt.RuntimeState.LIVE.value}


def live_runtime_sql(session_id: str) -> str:
    """``RuntimeAttachment.objects.live()`` as a boolean SQL expression, for the hand-written
    locking statements of the hot paths (the checkpoint's run lock, the transition's session
    lock): does the session whose id is the SQL expression ``session_id`` have a live runtime,
    its record live and its lease not run out at ``%(now)s``? The same one rule (docs/model.md#runtimes-and-leases;
    ``tests/sessions/test_expired_lease_writes.py`` checks that the two agree); parameters
    ``LIVE_RUNTIME_PARAMS`` and ``now``, by name."""
    return (
        f"EXISTS (SELECT 1 FROM {RuntimeAttachment._meta.db_table} AS lr WHERE lr.session_id = {session_id}"
        " AND lr.state = %(runtime_live_state)s AND lr.lease_expires_at > %(now)s)"
    )


class Run(models.Model):
    """One invocation inside a session (docs/model.md#runs)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    seq = models.PositiveIntegerField()
    generation = models.PositiveIntegerField()
    task_mode = models.CharField(max_length=64)
    target = models.CharField(max_length=200, blank=True, default="")
    cursor = models.JSONField(default=dict, blank=True)
    frozen_inputs = models.JSONField(default=list, blank=True)
    pending_external = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=_choices(rt.RunState), default=rt.RunState.OPEN.value)
    end_reason = models.CharField(max_length=200, blank=True, default="")
    abort_requested_at = models.DateTimeField(null=True, blank=True)
    resumed_from = models.ForeignKey("Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    checkpoint_count = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # Garbage collection asks whether any run's frozen inputs cite an artifact
            # (``control/graph_gc.py``): runs that cite nothing never touch the index.
            GinIndex(fields=["frozen_inputs"], opclasses=["jsonb_path_ops"], condition=~Q(frozen_inputs=[]),
                     name="run_cites_inputs"),
        ]
        constraints = [
            models.CheckConstraint(condition=_in_enum("state", rt.RunState), name="run_state_enum"),
            models.UniqueConstraint(fields=["session", "seq"], name="run_seq_unique_per_session"),
            # At most one open run per session.
            models.UniqueConstraint(fields=["session"], condition=Q(state=rt.RunState.OPEN), name="one_open_run_per_session"),
        ]


class Checkpoint(models.Model):
    """A validated cursor plus fingerprints and preconditions (docs/model.md#checkpoints). Immutable."""

    # No indexes of their own: ``checkpoint_session_id`` (session, id) and
    # ``checkpoint_seq_unique_per_run`` (run, seq) serve every lookup, the cascades included.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    seq = models.PositiveIntegerField()
    boundary = models.CharField(max_length=40, choices=_choices(rt.CheckpointBoundary))
    cursor = models.JSONField()
    artifacts = models.JSONField(default=list, blank=True)
    authority = models.JSONField(default=dict)
    pending = models.JSONField(default=dict, blank=True)
    approvals = models.JSONField(default=list, blank=True)
    resume_policy = models.CharField(max_length=64, default="revalidate")
    schema_version = models.PositiveSmallIntegerField(default=rt.CHECKPOINT_SCHEMA_VERSION)
    size_bytes = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    #: The client's idempotency key (optional) and the digest of the body it came with: a retry
    #: with the same key and body replays this checkpoint (control/checkpoints.py).
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_digest = models.CharField(max_length=64, null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["session", "id"], name="checkpoint_session_id"),
            GinIndex(fields=["artifacts"], opclasses=["jsonb_path_ops"], condition=CITES_ARTIFACTS,
                     name="checkpoint_cites_artifacts"),
        ]
        constraints = [
            models.CheckConstraint(condition=_in_enum("boundary", rt.CheckpointBoundary), name="checkpoint_boundary_enum"),
            models.UniqueConstraint(fields=["run", "seq"], name="checkpoint_seq_unique_per_run"),
            models.UniqueConstraint(
                fields=["run", "idempotency_key"], condition=Q(idempotency_key__isnull=False),
                name="checkpoint_idempotency_key_unique_per_run",
            ),
        ]


class KeyedOperation(models.TextChoices):
    """The writes that take an idempotency key in an ``IdempotentRequest``, and what each scopes it to."""

    START_RUN = "start_run"  # scope: the session
    ATTACH = "attach"  # scope: the session
    OPEN_GATE = "open_gate"  # scope: the session
    BATCH = "batch"  # scope: the run
    HAND_OFF = "hand_off"  # scope: the run


class IdempotentRequest(models.Model):
    """The first answer of an agent write that creates something, under the client's idempotency
    key (docs/agents.md#idempotency-keys): start a run, attach a runtime, a batch, a handoff, open
    a review gate. Written in the same transaction as the write it answers, so it exists exactly
    when the write committed; a retry with the same key and body replays ``answer``, another body
    is ``idempotency_key_reused`` (``actions/idempotency.py``). Rows go with their session."""

    Operation = KeyedOperation

    # No index of its own: rows are found by the unique (operation, scope_id, key); the cascade
    # from a forgotten session is rare and may scan.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+", db_index=False)
    operation = models.CharField(max_length=16, choices=KeyedOperation.choices)
    #: The id of the parent the key is scoped to: the session (start_run, attach, open_gate) or
    #: the run (batch, hand_off) named in the request's path.
    scope_id = models.BigIntegerField()
    key = models.CharField(max_length=200)
    request_digest = models.CharField(max_length=64)
    #: The first answer's status and what rebuilds it: the created object's id (and, for a
    #: batch, its checkpoints' ids and the run's count).
    status = models.PositiveSmallIntegerField()
    answer = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(operation__in=[o.value for o in KeyedOperation]),
                                   name="idempotent_request_operation_enum"),
            # One first answer per key and parent: a concurrent retry's insert waits on this index
            # and then finds the committed row (its own write rolled back, the first replayed).
            models.UniqueConstraint(fields=["operation", "scope_id", "key"], name="idempotent_request_key_unique"),
        ]


class TranscriptEntry(models.Model):
    """Per-session, append-only, bounded. Not memory, not authority (docs/model.md#transcript)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="transcript")
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16)
    content = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session_id", "seq"]
        verbose_name_plural = "transcript entries"
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="transcript_seq_unique_per_session"),
            models.CheckConstraint(condition=Q(role__in=["user", "assistant", "system", "tool"]), name="transcript_role_enum"),
        ]


class AnyId(models.Lookup):
    """``field__any=[ids]`` → ``field = ANY(%s::bigint[])``, for the event log's scoped reads.

    Why not ``__in`` or ``=``: PostgreSQL folds ``col = const`` (and a one-element ``IN``) into
    an equivalence, drops ``col`` from ``ORDER BY col, id`` as redundant, and then may walk
    the primary key in id order, filtering for ``col``: a plan that reads every later event
    of the table when the project's or session's events are old or sparse (they are: sessions
    live for a while, then go quiet). ``= ANY(array)`` creates no equivalence, so
    ``ORDER BY col, id`` can only come from a ``(col, …, id)`` index, which reads just the
    rows it returns (tests/test_event_query_plans.py walks the plans).
    """

    lookup_name = "any"
    prepare_rhs = False

    def get_prep_lookup(self):
        # An id beyond bigint names no row (as Django's own integer lookups answer): left out,
        # never a cast error.
        return [v for v in map(int, self.rhs) if -(2**63) <= v < 2**63]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::bigint[])", [*lhs_params, self.rhs]


models.BigIntegerField.register_lookup(AnyId)
models.ForeignKey.register_lookup(AnyId)


class Event(models.Model):
    """The append-only log: every state change, in the same transaction as the change.

    ``id`` is global and monotonic: the writing transaction's xid in its high bits (migration
    0004), and readers see only ids below the watermark of finished transactions
    (``events.visible``), so a reader that has seen id N will never later discover a committed
    id below N.
    ``session_id``/``run_id`` are plain columns, not foreign keys: the log outlives a
    forgotten session.
    """

    # No index of its own: ``event_project_id`` (project, id) serves every lookup by project,
    # the cascade included; a second index would only cost each insert.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="events", db_index=False)
    session_id = models.BigIntegerField(null=True, blank=True)
    run_id = models.BigIntegerField(null=True, blank=True)
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    actor = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["project", "id"], name="event_project_id"),
            models.Index(fields=["session_id", "id"], name="event_session_id"),
            # The type filters (GET /api/v1/events?type=, the project page's authority history)
            # and a session's events of one type (the session page's transition path) read
            # only their own rows, however many other events the project or session has.
            models.Index(fields=["project", "type", "id"], name="event_project_type_id"),
            models.Index(fields=["session_id", "type", "id"], name="event_session_type_id"),
        ]


class ApiToken(models.Model):
    """A bearer token for agents: hashed at rest, scoped to a project and permissions.

    Only the SHA-256 of the token is stored. Tokens are 256-bit random values, so a fast hash
    is enough (no password stretching needed); the plaintext is shown once at creation.
    """

    class Permission(models.TextChoices):
        READ = "read"  # list/get everything in the project
        WRITE = "write"  # sessions, runtimes, runs, checkpoints, transcript
        WORK = "work"  # claim handoffs, deliver results (workers)
        APPROVE = "approve"  # approve write intents, mark stale (managers)
        REVIEW = "review"  # claim review packets, submit verdicts (agent reviewers)
        PROJECT = "project"  # project-wide despite a session binding (artifacts, intents, authority history)
        MANAGE = "manage"  # the project's settings: webhook endpoints (docs/webhooks.md)

    name = models.CharField(max_length=200)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    key_prefix = models.CharField(max_length=16)
    permissions = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}…)"

    @staticmethod
    def hash_key(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    def has(self, permission: str) -> bool:
        return permission in self.permissions


class LanguagePreference(models.Model):
    """The language a person chose for the pages with the switcher (docs/pages.md#language): applied
    again at each login, in any browser. Nothing else reads it; the API answers in English."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="language_preference")
    language = models.CharField(max_length=16)
    updated_at = models.DateTimeField(auto_now=True)
