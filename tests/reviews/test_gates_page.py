"""The managers' reviews page (``/reviews/gates/``): every gate of the projects they manage with
its reviewers, waiting ones first; nobody else sees it (404), and another project's gates never
appear. The project page counts everyone asked to review, not only who already answered."""
from __future__ import annotations

import re

from django.test import Client

from reviews.models import ReviewGate
from tests.reviews.factories import make_user
from tests.support.factories import make_project


def test_a_manager_sees_every_gate_of_the_project_and_its_reviewers(world, as_user):
    first = world.gate(reviewers=["alice", "bob"])
    world.writer_api.post(f"/review-gates/{first.id}/cancel")
    second = world.gate(reviewers=["bob"])
    resp = as_user("mia").get("/reviews/gates/")
    assert resp.status_code == 200
    html = resp.content.decode()
    ids = [int(i) for i in re.findall(r'data-gate-id="(\d+)"', html)]
    assert ids == [second.id, first.id]  # waiting first, then the finished
    row = html[html.index(f'data-gate-id="{second.id}"'):html.index(f'data-gate-id="{first.id}"')]
    assert "bob" in row and "alice" not in row and f"session #{world.writer.id}, run #1" in row
    assert ReviewGate.objects.get(id=first.id).state == "cancelled"


def test_the_reviews_menu_of_a_manager_leads_there_and_a_reviewers_to_the_queue(world, as_user):
    world.gate()
    assert 'href="/reviews/gates/"' in as_user("mia").get("/").content.decode()
    queue = as_user("alice").get("/reviews/").content.decode()
    assert 'href="/reviews/gates/"' not in queue and 'href="/reviews/"' in queue


def test_nobody_else_sees_the_page_and_no_other_projects_gate_appears(world, as_user):
    world.gate()
    assert as_user("alice").get("/reviews/gates/").status_code == 404
    assert Client().get("/reviews/gates/").status_code == 302  # to the login page
    elsewhere = make_project("elsewhere")
    outsider = make_user(elsewhere, "otto", "manager")
    client = Client()
    client.force_login(outsider)
    html = client.get("/reviews/gates/").content.decode()
    assert "data-gate-id" not in html and "No review is waiting" in html


def test_the_project_page_counts_assigned_reviewers(world, as_user):
    world.gate(reviewers=["alice", "bob"])
    html = as_user("mia").get(f"/projects/{world.project.id}/").content.decode()
    assert re.search(r"<strong>2</strong> reviewers", html), html[html.find("review-stats"):][:400]
