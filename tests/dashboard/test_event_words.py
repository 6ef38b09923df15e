"""Every event type of the catalog has its words (``presenters.EVENT_WORDS``, the one map), the
live pages carry the same map, and ids and fingerprints stay out of an event's summary line."""
from __future__ import annotations

from novelforge_sessions import event_types as ev
from novelforge_sessions.dashboard import presenters


def test_every_catalog_event_type_has_words_and_nothing_else_does():
    assert set(presenters.EVENT_WORDS) == set(ev.CATALOG)
    for name in ev.CATALOG:
        words = presenters.event_words(name)
        assert words and words != name and "." not in words and "_" not in words, name


def test_an_unknown_type_reads_as_it_is():
    assert presenters.event_words("plugin.something_new") == "plugin.something_new"


def test_the_live_pages_get_the_same_map():
    assert presenters.words()["events"] == {k: str(v) for k, v in presenters.EVENT_WORDS.items()}


def test_ids_and_fingerprints_go_to_the_details_not_the_summary():
    payload = {"artifact_id": 7, "name": "chapter-01", "version": 1, "fingerprint": "sha256:" + "a" * 64}
    summary = presenters.describe(ev.ARTIFACT_CREATED.name, payload)
    assert "sha256:" not in summary and "artifact_id" not in summary and "chapter-01" in summary
    (view,) = presenters.event_views([type("E", (), {"id": 1, "type": ev.ARTIFACT_CREATED.name, "session_id": None,
                                                      "project_id": 1, "payload": payload, "created_at": None})()])
    assert "fingerprint=sha256:" in view.details and "artifact_id=7" in view.details
    assert view.words == "artifact created"


def test_durations_in_words():
    assert presenters.duration_text(0.3) == "under a second"
    assert presenters.duration_text(1) == "1 second"
    assert presenters.duration_text(42) == "42 seconds"
    assert presenters.duration_text(240) == "4 minutes"
    assert presenters.duration_text(3 * 3600 + 5) == "3 hours"
