"""The session transcript: append-only and bounded. Not memory, not authority (docs/model.md#transcript).

Nothing in the service reads it back to reconstruct state: resume uses checkpoints, and
review packets are built from an allowlist that does not include it. Events about it carry
its sequence number and role, never its content.
"""
from __future__ import annotations

from django.conf import settings
from django.db import transaction

from novelforge_sessions import event_types as ev
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions.lifecycle import Outbox, check, fence_runtime, lock_session
from novelforge_sessions.errors import SessionTerminated, TranscriptFull
from novelforge_sessions.models import TranscriptEntry


def append_transcript(
    caller: Caller, session_id: int, *, role: str, content: str, runtime_id: int | None = None
) -> TranscriptEntry:
    """Refusals: not found → a terminated session (``session_terminated``) → generation fencing
    (a late append from a superseded generation is not stored) → ``transcript_full``."""
    caller.require("write")
    check(rt.validate_transcript_entry, role=role, content=content, max_bytes=settings.TRANSCRIPT_ENTRY_MAX_BYTES)
    with transaction.atomic():
        session = lock_session(caller, session_id)
        if session.status == rt.SessionStatus.TERMINATED:
            raise SessionTerminated("a terminated session's transcript is closed", status=session.status)
        fence_runtime(caller, session, runtime_id)
        if session.transcript_length >= settings.TRANSCRIPT_MAX_ENTRIES:
            raise TranscriptFull(
                "the transcript reached its bound", limit=settings.TRANSCRIPT_MAX_ENTRIES
            )
        session.transcript_length += 1
        entry = TranscriptEntry.objects.create(session=session, seq=session.transcript_length, role=role, content=content)
        session.save(update_fields=["transcript_length", "updated_at"])
        outbox = Outbox(caller.label)
        outbox.add(session, ev.TRANSCRIPT_APPENDED, seq=entry.seq, role=role)
        outbox.flush()
    return entry
