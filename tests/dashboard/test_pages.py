"""Manager pages: login, scoping to managed projects (others' ids are 404), server-rendered truth."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions.sessions import transition_session
from novelforge_sessions.models import Event, Membership
from tests.support.factories import caller_for, make_project
from tests.dashboard.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db


def row_ids(html: str) -> set[int]:
    return {int(n) for n in re.findall(r'data-session-id="(\d+)"', html)}


@pytest.mark.parametrize("url", ["/", "/counts/", "/sessions/1/", "/sessions/1/panels/", "/sessions/1/row/",
                                 "/sessions/1/resume/", "/projects/1/"])
def test_pages_need_a_login(url):
    resp = Client().get(url)
    assert resp.status_code == 302 and resp["Location"].startswith("/login/?next=")


def test_overview_lists_only_the_managers_projects(mgr_client, make_session, other_project):
    mine = make_session(run=True)
    theirs = make_session(in_project=other_project)
    resp = mgr_client.get("/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert row_ids(html) == {mine.id}
    assert f"session #{theirs.id}" not in html and other_project.name not in html
    # Server-rendered current truth (the page makes sense with JavaScript off).
    assert re.search(rf'id="session-{mine.id}"[^>]*data-state="running"', html)
    assert 'data-count="running">1<' in html and 'data-count="total">1<' in html


def test_overview_filters_and_counts(mgr_client, make_session, project, other_project):
    running = make_session(run=True)
    created = make_session(attach=False, role="manager", memory_policy="session")
    html = mgr_client.get("/", {"state": "running"}).content.decode()
    assert row_ids(html) == {running.id}
    assert 'data-count="created">1<' in html, "counts ignore the state filter, so every tile stays clickable"
    assert row_ids(mgr_client.get("/", {"role": "manager"}).content.decode()) == {created.id}
    assert row_ids(mgr_client.get("/", {"family": "nope"}).content.decode()) == set()
    assert mgr_client.get("/counts/", {"project": project.id}).json()["counts"]["running"] == 1
    # Someone else's project id is not an oracle: 404, like one that does not exist.
    assert mgr_client.get("/", {"project": other_project.id}).status_code == 404
    assert mgr_client.get("/counts/", {"project": other_project.id}).status_code == 404


def test_a_family_filter_the_database_cannot_compare_matches_nothing(mgr_client, make_session):
    """``?family=co%00dex`` reached PostgreSQL (a 500 page, and an HTML 500 from the
    JSON counts). A family holding U+0000 names no session: the overview, its counts and a row
    answer as for any family nobody uses."""
    session = make_session(run=True)
    resp = mgr_client.get("/", {"family": "co\x00dex"})
    assert resp.status_code == 200 and row_ids(resp.content.decode()) == set()
    counts = mgr_client.get("/counts/", {"family": "co\x00dex"})
    assert counts.status_code == 200 and counts["Content-Type"] == "application/json"
    assert counts.json()["total"] == 0 and set(counts.json()["counts"].values()) == {0}
    assert mgr_client.get(f"/sessions/{session.id}/row/", {"family": "co\x00dex"}).status_code == 204
    assert row_ids(mgr_client.get("/", {"family": session.runtime_family}).content.decode()) == {session.id}


def test_overview_pages_by_keyset(mgr_client, make_session, monkeypatch):
    from novelforge_sessions.dashboard import views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    made = [make_session(attach=False).id for _ in range(5)]
    first = mgr_client.get("/").content.decode()
    assert row_ids(first) == set(made[-2:])
    older = re.search(r'href="(\?before=\d+)">Older', first).group(1)
    assert row_ids(mgr_client.get("/" + older).content.decode()) == set(made[1:3])


def test_failed_and_stale_rows_stand_out(mgr_client, make_session):
    failed = make_session(run=True)
    transition_session(caller_for(failed.project), failed.id, "failed", reason="boom")
    fine = make_session(run=True)
    html = mgr_client.get("/").content.decode()
    assert re.search(rf'id="session-{failed.id}"[^>]*class="srow standout', html)
    assert re.search(rf'id="session-{fine.id}"[^>]*class="srow row-running', html)
    # The live repaint (static/js/overview.js) highlights the statuses the server names, never its own copy.
    assert 'data-attention-states="failed stale"' in html


def test_a_reviewer_without_manager_role_lands_on_the_review_queue(make_session, project):
    make_session()
    reviewer = make_user("reviewer", project, role=Membership.Role.REVIEWER)
    resp = logged_in(reviewer).get("/")
    assert resp.status_code == 302 and resp["Location"] == "/reviews/"
    # Also with filters in the URL: nothing about the sessions is rendered, not even a 404.
    assert logged_in(reviewer).get("/", {"project": project.id})["Location"] == "/reviews/"


def test_a_user_without_any_membership_sees_an_empty_dashboard(make_session):
    make_session()
    nobody = make_user("nobody")
    html = logged_in(nobody).get("/").content.decode()
    assert row_ids(html) == set() and "You do not manage any project yet." in html


def test_session_page_shows_identity_diagram_timeline_checkpoints(mgr_client, make_session):
    from novelforge_sessions.control.checkpoints import record_checkpoint

    session = make_session(run=True, provider_metadata={"thread_id": "th_123"})
    run = session.runs.get()
    record_checkpoint(caller_for(session.project), run.id, {"boundary": "context_freeze", "cursor": {"step": "outline"}})
    resp = mgr_client.get(f"/sessions/{session.id}/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert f"Session #{session.id}" in html and "metadata only" in html and "th_123" in html
    # Diagram: nine states, current lit, legal next outlined — straight from the lifecycle table.
    assert len(re.findall(r'<g class="node ', html)) == 9
    assert re.search(r'class="node st-running current[^"]*" data-state="running"', html)
    outlined = set(re.findall(r'class="node st-(\w+) next', html))
    assert outlined == {s.value for s in lc.SESSION.table[rt.SessionStatus.RUNNING]}
    assert 'data-edge="created>running"' in html and re.search(r'class="edge taken[^"]*" d="[^"]+" data-edge="created>running"', html)
    assert "run #1" in html and "context freeze" in html and "context_freeze" in html
    assert 'data-cursor="' in html and "/static/js/session.js" in html


def test_session_page_embeds_the_review_panel(mgr_client, make_session):
    session = make_session()
    html = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    assert '<div data-panel="reviews">' in html and 'id="review-gates"' in html


def test_session_panels_json_re_renders_the_live_parts(mgr_client, make_session):
    session = make_session(run=True)
    data = mgr_client.get(f"/sessions/{session.id}/panels/").json()
    assert data["status"] == "running"
    assert set(data["panels"]) == {"identity", "conflicts", "charts", "diagram", "timeline", "handoffs", "checkpoints",
                                   "runtimes", "actions", "reviews"}
    assert 'data-state="running" aria-current="true"' in data["panels"]["diagram"]
    assert "csrfmiddlewaretoken" in data["panels"]["actions"]
    assert 'id="review-gates"' in data["panels"]["reviews"]


def test_row_partial_is_204_when_filtered_out(mgr_client, make_session):
    session = make_session(run=True)
    assert mgr_client.get(f"/sessions/{session.id}/row/").status_code == 200
    assert mgr_client.get(f"/sessions/{session.id}/row/", {"state": "idle"}).status_code == 204


@pytest.mark.parametrize("path", ["/sessions/{id}/", "/sessions/{id}/panels/", "/sessions/{id}/row/", "/sessions/{id}/resume/"])
def test_another_projects_session_is_404(mgr_client, make_session, other_project, path):
    theirs = make_session(in_project=other_project, run=True)
    assert mgr_client.get(path.format(id=theirs.id)).status_code == 404


def test_project_page_shows_authority_and_artifacts(mgr_client, project, other_project):
    from novelforge_sessions.actions.artifacts import create_artifact

    artifact = create_artifact(caller_for(project), name="chapter-1", kind="chapter", content="It was a dark night.")
    resp = mgr_client.get(f"/projects/{project.id}/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert f"v{project.authority_version}" in html and project.lock_fingerprint in html  # full value for copy
    assert "chapter-1" in html and artifact.current_version.fingerprint in html
    assert 'id="write-intents"' in html
    assert mgr_client.get(f"/projects/{other_project.id}/").status_code == 404
    assert mgr_client.get("/projects/999999/").status_code == 404


def test_pages_render_the_event_cursor_before_the_data(mgr_client, make_session):
    session = make_session(run=True)
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    html = mgr_client.get("/").content.decode()
    assert f'data-cursor="{last}"' in html
    assert f'data-cursor="{last}"' in mgr_client.get(f"/sessions/{session.id}/").content.decode()


def test_a_manager_of_two_projects_sees_both(make_session, project, other_project):
    both = make_user("both", project)
    Membership.objects.create(user=both, project=other_project, role=Membership.Role.MANAGER)
    third = make_project("third")
    a, b, c = make_session(), make_session(in_project=other_project), make_session(in_project=third)
    assert row_ids(logged_in(both).get("/").content.decode()) == {a.id, b.id}
    assert c.id not in row_ids(logged_in(both).get("/").content.decode())


def test_page_query_counts_do_not_grow_with_the_data(mgr_client, make_session):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert mgr_client.get(url).status_code == 200
        return len(ctx.captured_queries)

    first = make_session(run=True)
    small = (queries("/"), queries(f"/sessions/{first.id}/"))
    for _ in range(4):
        make_session(run=True)
    run = first.runs.get()
    from novelforge_sessions.control.checkpoints import record_checkpoint

    for n in range(3):
        record_checkpoint(caller_for(first.project), run.id, {"boundary": "context_freeze", "cursor": {"n": n}})
    assert (queries("/"), queries(f"/sessions/{first.id}/")) == small


@pytest.mark.parametrize("query", [{"before": "9" * 30}, {"before": "²"}, {"project": "9" * 30}, {"project": "x"},
                                   {"state": "nonsense"}, {"role": "<script>"}])
def test_odd_query_values_never_500(mgr_client, make_session, query):
    make_session()
    assert mgr_client.get("/", query).status_code in (200, 404)
