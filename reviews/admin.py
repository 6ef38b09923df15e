"""Admin: review records are read-only (they change only through ``reviews.actions``).

Calibration material is listed separately and only to superusers/staff through the admin; it
is never shown on a reviewer page.
"""
from __future__ import annotations

from django.contrib import admin

from novelforge_sessions.admin import ReadOnlyAdmin
from reviews.models import GateCalibration, ReviewAssignment, ReviewGate, ReviewPacket, Verdict


@admin.register(ReviewGate)
class ReviewGateAdmin(ReadOnlyAdmin):
    list_display = ("id", "project", "session", "route", "state", "outcome", "bound_verdicts", "required_verdicts", "created_at")
    list_filter = ("state", "route", "project")


@admin.register(ReviewPacket)
class ReviewPacketAdmin(ReadOnlyAdmin):
    list_display = ("id", "gate", "fingerprint", "created_at")


@admin.register(ReviewAssignment)
class ReviewAssignmentAdmin(ReadOnlyAdmin):
    list_display = ("id", "packet", "reviewer", "state", "assigned_at", "submitted_at")
    list_filter = ("state",)


@admin.register(Verdict)
class VerdictAdmin(ReadOnlyAdmin):
    list_display = ("id", "packet", "reviewer", "channel", "decision", "confidence", "bound_at")
    list_filter = ("decision", "channel")


@admin.register(GateCalibration)
class GateCalibrationAdmin(ReadOnlyAdmin):
    list_display = ("gate", "expected_decision", "created_at")
