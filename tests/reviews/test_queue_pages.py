"""The reviewer queue (``/reviews/``) pages both of its lists:
"To review" oldest first with ``?after=``, "Submitted" newest first with ``?before=`` (keyset on
the packet ids the page shows), each count the true total, every packet reachable exactly once by
following the links, and a cursor the reviewer cannot use (not theirs, not a number) is no cursor."""
from __future__ import annotations

import html as htmllib
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.apikit.auth import caller_for_token
from reviews import actions, views
from reviews.access import reviewer_for_user
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from tests.reviews.factories import RUBRIC, add_writer, citing, orchestrator, verdict_for

pytestmark = pytest.mark.django_db

PAGE = 4


@pytest.fixture
def small_pages(monkeypatch) -> int:
    monkeypatch.setattr(views, "QUEUE_PAGE_SIZE", PAGE, raising=False)  # (the unpaged queue had no size)
    return PAGE


def submit(world, gate: ReviewGate, username: str = "alice") -> None:
    body = verdict_for(gate)
    actions.bind_verdict(reviewer_for_user(world.users[username]), gate.packet.id, body, channel=Verdict.Channel.PAGE)


def gate_of_another_writer(world, reviewers: list[str]) -> ReviewGate:
    """A page gate opened by a writer session of its own (a session waits on one gate at a time)."""
    writer, raw = add_writer(world.project)
    caller = caller_for_token(raw)
    start_run(orchestrator(world.project), writer.id, frozen_inputs=citing(world.version))  # gives it the artifact
    return actions.open_gate(caller, writer.id, actions.GateSpec(
        candidate_version_id=world.version.id, rubric=RUBRIC, route="page", reviewers=reviewers))


def section(page: str, name: str) -> str:
    rest = page.split(f'id="{name}"', 1)[1]
    return rest.split("</section>", 1)[0]


def count(page: str, name: str) -> int:
    return int(re.search(r'<span class="count">(\d+)</span>', section(page, name)).group(1))


def packet_ids(page: str, name: str) -> list[int]:
    return [int(i) for i in re.findall(r'data-packet-id="(\d+)"', section(page, name))]


def link(page: str, name: str, which: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" data-pager="{which}">', section(page, name))
    return htmllib.unescape(found.group(1)) if found else None


def walk(client: Client, name: str) -> list[list[int]]:
    """Every page of one list, following its "more" links from the first page."""
    pages, url = [], "/reviews/"
    while url:
        resp = client.get(url if url.startswith("/") else "/reviews/" + url)
        assert resp.status_code == 200
        text = resp.content.decode()
        pages.append(packet_ids(text, name))
        url = link(text, name, "more")
        assert len(pages) < 50, "the links loop"
    return pages


@pytest.fixture
def queue(world, small_pages):
    """alice: 9 submitted reviews (three submitted at the same instant) and 6 packets to review
    (two assigned at the same instant); bob has one of his own."""
    done = []
    for _ in range(9):  # the writer's run continues after each bound verdict and opens the next gate
        done.append(world.gate())
        submit(world, done[-1])
    waiting = [gate_of_another_writer(world, ["alice"]) for _ in range(6)]
    now = timezone.now()
    mine = ReviewAssignment.objects.filter(reviewer=reviewer_for_user(world.users["alice"]).key)
    for i, gate in enumerate(done):  # the same instant for the last three: the id breaks the tie
        mine.filter(packet=gate.packet).update(submitted_at=now - timedelta(minutes=max(9 - i, 1)))
    for i, gate in enumerate(waiting):
        mine.filter(packet=gate.packet).update(assigned_at=now - timedelta(minutes=max(6 - i, 2)))
    bobs = gate_of_another_writer(world, ["bob"])
    return {"done": [g.packet.id for g in done], "waiting": [g.packet.id for g in waiting], "bob": bobs.packet.id}


def test_the_totals_stop_at_the_cap_and_say_more_than(queue, as_user, monkeypatch):
    """A reviewer with more assignments than a page should count sees "N+" (``counting.COUNT_CAP``):
    the page counts up to the cap instead of reading every assignment to say how many."""
    from novelforge_sessions import counting

    monkeypatch.setattr(counting, "COUNT_CAP", 7)
    first = as_user("alice").get("/reviews/").content.decode()
    assert count(first, "to-review") == 6  # under the cap: the true total
    assert '<span class="count">7+</span>' in section(first, "submitted")  # 9 submitted: past the cap
    assert len(packet_ids(first, "submitted")) == PAGE


def test_both_lists_page_and_every_packet_is_reachable_once(queue, as_user):
    alice = as_user("alice")
    first = alice.get("/reviews/").content.decode()
    assert count(first, "to-review") == 6 and count(first, "submitted") == 9  # totals, not the page's length
    assert len(packet_ids(first, "to-review")) == PAGE and len(packet_ids(first, "submitted")) == PAGE

    # "To review": oldest first (assigned_at, then id), pages of PAGE, nothing twice, nothing left out.
    todo = walk(alice, "to-review")
    assert [len(p) for p in todo] == [4, 2]
    assert sum(todo, []) == queue["waiting"]
    # "Submitted": newest first (submitted_at, then id), every one reachable — the oldest included.
    done = walk(alice, "submitted")
    assert [len(p) for p in done] == [4, 4, 1]
    assert sum(done, []) == [*reversed(queue["done"][6:]), *reversed(queue["done"][:6])]
    assert queue["bob"] not in sum(todo + done, [])


def test_the_links_say_where_they_go_in_plain_words(queue, as_user):
    alice = as_user("alice")
    first = alice.get("/reviews/").content.decode()
    assert "Newer →" in section(first, "to-review") and "Older →" in section(first, "submitted")
    assert link(first, "to-review", "first") is None and link(first, "submitted", "first") is None
    second = alice.get("/reviews/" + link(first, "submitted", "more")).content.decode()
    assert "← Back to the newest" in section(second, "submitted")
    assert count(second, "submitted") == 9 and count(second, "to-review") == 6
    assert link(second, "submitted", "first") == "/reviews/"
    # Moving one list keeps the other where it is.
    both = alice.get("/reviews/" + link(second, "to-review", "more")).content.decode()
    assert packet_ids(both, "submitted") == packet_ids(second, "submitted")
    assert packet_ids(both, "to-review") == queue["waiting"][PAGE:]
    assert "← Back to the oldest" in section(both, "to-review")
    back = link(both, "to-review", "first")
    assert back.startswith("?before=") and "after=" not in back


@pytest.mark.parametrize("cursor", ["abc", "-1", "0", "99999999999999999999", "1e3", "bob's", "7\n"])
def test_a_cursor_that_is_not_one_of_my_packets_is_the_first_page(queue, as_user, cursor):
    alice = as_user("alice")
    first = alice.get("/reviews/").content.decode()
    for value in (cursor, str(queue["bob"])):  # someone else's packet is no cursor either: not an oracle
        resp = alice.get("/reviews/", {"after": value, "before": value})
        assert resp.status_code == 200
        text = resp.content.decode()
        for name in ("to-review", "submitted"):
            assert packet_ids(text, name) == packet_ids(first, name)
            assert link(text, name, "first") is None


def test_an_empty_queue_says_so(world, as_user):
    text = as_user("bob").get("/reviews/").content.decode()
    assert count(text, "to-review") == 0 and count(text, "submitted") == 0
    assert "Nothing is waiting for you." in text and "You have not submitted any reviews yet." in text
    assert 'data-pager="' not in text
