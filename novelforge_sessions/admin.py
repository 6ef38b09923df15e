"""Admin: projects, memberships and tokens are editable; runtime records are read-only.

Runtime records (sessions, runs, checkpoints, transcript, events) change only through the
actions, which enforce the lifecycle table and write events; the admin shows them.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import (
    ApiToken,
    Artifact,
    ArtifactVersion,
    Checkpoint,
    Event,
    Membership,
    Project,
    Run,
    RuntimeAttachment,
    Session,
    TranscriptEntry,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "authority_version", "framework_version", "requires_write_approval", "created_at")
    search_fields = ("slug", "name")
    readonly_fields = ("authority_version", "lock_fingerprint")  # changed only by approved writes
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "role")
    list_filter = ("role", "project")


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ("name", "project", "kind", "current_version", "created_at")
    list_filter = ("project",)


@admin.register(ArtifactVersion)
class ArtifactVersionAdmin(ReadOnlyAdmin):
    list_display = ("artifact", "number", "fingerprint", "created_at")


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ("id", "project", "role", "status", "task_mode", "runtime_family", "generation", "updated_at")
    list_filter = ("status", "role", "project", "runtime_family")


@admin.register(RuntimeAttachment)
class RuntimeAttachmentAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "generation", "runtime_family", "state", "lease_expires_at")
    list_filter = ("state",)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "seq", "state", "task_mode", "started_at", "ended_at")
    list_filter = ("state",)


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "session", "run", "seq", "boundary", "created_at")


@admin.register(TranscriptEntry)
class TranscriptEntryAdmin(ReadOnlyAdmin):
    list_display = ("session", "seq", "role", "created_at")


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "project", "session_id", "type", "actor", "created_at")
    list_filter = ("type", "project")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Creating a token here shows its secret once, in a message; only its hash is stored."""

    list_display = ("name", "project", "session", "key_prefix", "permissions", "created_at", "last_used_at", "revoked_at")
    fields = ("name", "project", "session", "permissions", "revoked_at")
    readonly_fields = ()

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        return ("name", "project", "session", "permissions") if obj else ()

    def save_model(self, request: HttpRequest, obj: ApiToken, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, raw = create_token(obj.project, name=obj.name, permissions=list(obj.permissions or ["read"]), session=obj.session)
        obj.pk = token.pk
        obj.refresh_from_db()
        messages.warning(request, f"Token created. Copy it now, it is not shown again: {raw}")
