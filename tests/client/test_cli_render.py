"""The CLI's human rendering of a resume report (pure formatting: no server, no database)."""
from __future__ import annotations


def test_a_refused_report_is_rendered_step_by_step():
    from novelforge_client.cli import render_report
    from novelforge_client.models import ResumeReportOut

    report = ResumeReportOut.model_validate({
        "ok": False, "dry_run": True, "session_id": 7, "checkpoint_id": 3, "generation": None, "runtime_id": None,
        "run_id": None, "repairs": ["deliver or cancel handoff chapter-3"],
        "steps": [{"step": "artifacts", "ok": True, "detail": "2 current", "data": {}, "repair": None},
                  {"step": "handoffs", "ok": False, "detail": "chapter-3 is pending", "data": {},
                   "repair": "deliver or cancel handoff chapter-3"}],
    })
    text = render_report(report)
    assert text.splitlines()[0] == "resume of session 7: REFUSED (dry run: nothing changed)"
    assert "[ok  ] artifacts  2 current" in text and "[FAIL] handoffs   chapter-3 is pending" in text
    assert "repair: deliver or cancel handoff chapter-3" in text
