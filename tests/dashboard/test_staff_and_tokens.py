"""Staff flags and API tokens grant nothing the access model does not say (docs/model.md#access).

The access model: a human sees the projects where they hold a membership (managers on the
dashboard, reviewers their own packets); the admin is an operator's tool where a staff user sees
exactly the models their Django permissions name (none: nothing), read-only for runtime records;
bearer tokens are for the API and the live stream only and never open a page. So ``is_staff``
alone adds nothing, and a staff manager of one project sees that project only.
"""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import Membership, Session
from tests.dashboard.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db

PAGES = ["/", "/counts/", "/sessions/{s}/", "/sessions/{s}/panels/", "/sessions/{s}/row/", "/projects/{p}/",
         "/reviews/", "/reviews/calibration/"]


def staff(username: str, project=None, role=Membership.Role.MANAGER, perms: tuple[str, ...] = ()):
    user = make_user(username, project, role)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="novelforge_sessions"))
    return user


def row_ids(html: str) -> set[int]:
    return {int(n) for n in re.findall(r'data-session-id="(\d+)"', html)}


def test_staff_without_memberships_or_permissions_sees_nothing(make_session, project):
    session = make_session(run=True)
    client = logged_in(staff("ops"))
    resp = client.get("/")
    assert resp.status_code == 200 and row_ids(resp.content.decode()) == set()
    for path in ("/sessions/{s}/", "/sessions/{s}/panels/", "/sessions/{s}/row/", "/projects/{p}/"):
        assert client.get(path.format(s=session.id, p=project.id)).status_code == 404, path
    assert 'data-packet-id' not in client.get("/reviews/").content.decode()
    # The admin: in, but no model, and every model page refused.
    index = client.get("/admin/")
    assert index.status_code == 200 and "novelforge_sessions/session" not in index.content.decode()
    for url in ("/admin/novelforge_sessions/session/", f"/admin/novelforge_sessions/session/{session.id}/change/",
                "/admin/novelforge_sessions/apitoken/", "/admin/auth/user/"):
        assert client.get(url).status_code == 403, url


def test_a_staff_manager_sees_their_project_only(make_session, project, other_project):
    mine, theirs = make_session(run=True), make_session(in_project=other_project, run=True)
    client = logged_in(staff("ops-manager", project))
    assert row_ids(client.get("/").content.decode()) == {mine.id}
    assert client.get(f"/sessions/{mine.id}/").status_code == 200
    assert client.get(f"/sessions/{theirs.id}/").status_code == 404
    assert client.get(f"/projects/{other_project.id}/").status_code == 404


def test_staff_with_a_view_permission_reads_that_model_only_and_changes_nothing(make_session):
    session = make_session(run=True)
    client = logged_in(staff("ops-viewer", perms=("view_session",)))
    assert client.get("/admin/novelforge_sessions/session/").status_code == 200
    assert client.get(f"/admin/novelforge_sessions/session/{session.id}/change/").status_code == 200
    before = (session.status, session.version)
    assert client.post(f"/admin/novelforge_sessions/session/{session.id}/change/", {"status": "completed"}).status_code == 403
    session.refresh_from_db()
    assert (session.status, session.version) == before
    for url in ("/admin/novelforge_sessions/apitoken/", "/admin/novelforge_sessions/checkpoint/", "/admin/auth/user/"):
        assert client.get(url).status_code == 403, url
    # Still nothing on the dashboard: the admin permission is not a membership.
    assert client.get(f"/sessions/{session.id}/").status_code == 404


@pytest.mark.parametrize("bound", [False, True], ids=["project-token", "session-bound-token"])
def test_a_bearer_token_opens_no_page(make_session, project, bound):
    session = make_session(run=True)
    _, raw = create_token(project, name="agent", permissions=ALL_PERMISSIONS,
                          session=Session.objects.get(id=session.id) if bound else None)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for path in PAGES + ["/admin/"]:
        resp = client.get(path.format(s=session.id, p=project.id))
        assert resp.status_code == 302 and "login" in resp["Location"], (path, resp.status_code)
