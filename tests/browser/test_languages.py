"""The manager's and the reviewer's walks in both languages (docs/pages.md#language), in headless
Chromium against a real daphne: the language is chosen with the switcher on the login page (and
kept after the login), every page of the walk passes axe-core with 0 serious or critical
violations, and in Simplified Chinese no page shows an English UI string: none of the catalog's
messages (django.po and djangojs.po, placeholders and markup aside) appears in the visible text,
nor in the labels a screen reader reads (aria-label, title, placeholder) — the refusals and the resume
report included: a relay answer refused, a resume's dry-run report — nor on the page of a session that
was closed and resumed (an interrupted run, a checkpoint's boundary, the resume's line), nor a session's
role as its code; and the live
summaries the script writes say what the server says in that language. The reviewer's packet text is
never translated. Screenshots: tests/artifacts/lang-<language>-<page>.png."""
from __future__ import annotations

import re
import subprocess

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from django.utils import translation

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.control.handoffs import create_handoff
from novelforge_sessions.control.resume import resume_session
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.event_types import family_of
from novelforge_sessions.models import LanguagePreference, Membership
from novelforge_sessions.session_runtime import SessionRole
from reviews.verdicts import VERDICT_FIELDS
from tests.browser.a11y import assert_no_serious_a11y_violations
from tests.browser.conftest import screenshot
from tests.reviews.factories import CHAPTER, PASSWORD, RUBRIC, make_world, orchestrator
from tests.support.servers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

LANGUAGES = ["en", "zh-hans"]
SWITCH = {"en": "English", "zh-hans": "简体中文"}
NAV = {"en": ["Sessions", "Reviews", "Calibration"], "zh-hans": ["会话", "审阅", "校准"]}
CATALOGS = [ROOT / "locale" / "zh_Hans" / "LC_MESSAGES" / f"{d}.po" for d in ("django", "djangojs")]
#: Words that are also data on these pages (a state code in a title, a route key), and the
#: product's name (a proper name, shown as is in every language, and the head of the emails'
#: subjects: "NovelForge: …"): a one-word fragment equal to one of these is not looked for.
DATA_WORDS = {"live", "novelforge"}


def _english_ui_strings() -> list[str]:
    """Every English fragment of the catalogs' messages that a page could show as is: each msgid
    (and plural) split at placeholders and markup, fragments of at least 4 letters."""
    fragments: set[str] = set()
    for catalog in CATALOGS:
        flat = subprocess.run(["msgcat", "--no-wrap", "--no-location", str(catalog)], capture_output=True,
                              text=True, check=True).stdout
        for quoted in re.findall(r'^msgid(?:_plural)? "(.*)"$', flat, flags=re.M):
            text = quoted.encode().decode("unicode_escape").encode("latin-1").decode()
            for part in re.split(r"%\(\w+\)[sd]|%\(\w+\)\.\d+f|\{\w+\}|<[^>]+>|&\w+;", text):
                part = part.strip(" .,:;()·—–…?")
                if len(re.sub(r"[^A-Za-z]", "", part)) >= 4 and part.lower() not in DATA_WORDS:
                    fragments.add(part)
    return sorted(fragments, key=len, reverse=True)


#: A session's role is said in words (presenters.ROLE_WORDS): its code (``semantic_reviewer``) is looked for
#: too, not taken for data.
ENGLISH = sorted({*_english_ui_strings(), *(r.value for r in SessionRole)}, key=len, reverse=True)

#: What a person reads: the visible text, the title, and what a screen reader says for a control
#: (aria-label, placeholder). ``title`` attributes are left out: they keep the codes on purpose
#: (``data-state``/``title``: docs/pages.md, "States and reasons in words").
VISIBLE_AND_LABELS = """() => {
  const out = [document.body.innerText, document.title];
  for (const n of document.querySelectorAll('[aria-label], [placeholder]')) {
    for (const a of ['aria-label', 'placeholder']) if (n.hasAttribute(a)) out.push(n.getAttribute(a));
  }
  return out.join('\\n');
}"""


def _untranslated(page, *, allowed: tuple[str, ...] = ()) -> list[str]:
    """The catalog's English fragments found on the page, as whole words (codes such as
    ``semantic_reviewer`` are words of their own; data the test put there, ``allowed``, and an unknown
    event's ``key=value`` payload are taken out first)."""
    text = page.evaluate(VISIBLE_AND_LABELS)
    for value in allowed:
        text = text.replace(value, " ")
    text = re.sub(r"\b\w+=\S*", " ", text)  # an unknown event's payload, key=value: data
    found = []
    for fragment in ENGLISH:
        m = re.search(r"(?<![A-Za-z_])" + re.escape(fragment) + r"(?![A-Za-z_])", text)
        if m:
            found.append(f"{fragment!r} in …{text[max(0, m.start() - 40):m.end() + 40]!r}…")
    return found


#: Events the live pages summarise in words (static/js/dashboard.js, from the page's maps and its catalog).
LIVE_EVENTS = [
    ("run.ended", {"seq": 1, "state": "interrupted", "reason": "closed by manager"}),
    ("run.ended", {"seq": 2, "state": "aborted", "reason": "an agent's own words"}),
    ("checkpoint.recorded", {"seq": 3, "boundary": "external_wait"}),
    ("checkpoint.recorded", {"seq": 4, "boundary": "before_canon_settlement"}),
    ("session.resumed", {"run_id": 9, "generation": 2, "checkpoint_id": 3, "reason": "resumed by manager",
                         "carried_over": {"handoffs": [{"handoff_id": 1}, {"handoff_id": 2}], "gates": [{"gate_id": 4}]}}),
    ("session.resumed", {"generation": 3, "checkpoint_id": None, "carried_over": {"other": [{}]}}),
    ("session.created", {"role": "semantic_reviewer", "memory_policy": "none", "task_mode": "drafting",
                         "runtime_family": "claude-code", "status": "created"}),
    ("session.created", {"role": "other", "memory_policy": "none", "task_mode": "drafting",
                         "runtime_family": "claude-code", "status": "created"}),
]


def _resumed_session(project):
    """A session whose run waits on a handoff from an ``external_wait`` checkpoint, closed and resumed as a
    manager's actions leave it: the waiting run ends interrupted, the handoff is carried over."""
    who = orchestrator(project)
    session = sessions.create_session(who, sessions.NewSession(
        role="writer", memory_policy="session", task_mode="drafting", runtime_family="claude-code"),
        runtime=RuntimeSpec("claude-code", ["draft"], lease_seconds=600))
    run = runs.start_run(who, session.id, cursor={"step": "draft"})
    create_handoff(who, run.id, logical_id="chapter-2/check", required_capabilities=[], timeout_seconds=600)
    record_checkpoint(who, run.id, {"boundary": "external_wait", "cursor": {"step": "wait"},
                                    "pending": {"handoffs": ["chapter-2/check"]}})
    sessions.close_session(who, session.id, reason="closed by manager")
    resume_session(who, session.id, runtime=RuntimeSpec("claude-code", ["draft"], lease_seconds=600),
                   reason="resumed by manager")
    return session


def _choose(page, server, language: str) -> None:
    """The switcher on the login page, as a person would: the page comes back in that language."""
    page.goto(server.url + "/login/")
    page.get_by_role("button", name=SWITCH[language]).click()
    page.wait_for_load_state("networkidle")
    expect(page.locator("html")).to_have_attribute("lang", language)
    expect(page.get_by_role("button", name=SWITCH[language])).to_have_attribute("aria-pressed", "true")


def _log_in(page, server, username: str) -> None:
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.locator("form[action='/login/'] button[type=submit]").click()
    page.wait_for_load_state("networkidle")


def _check(page, language: str, name: str, *, allowed: tuple[str, ...] = ()) -> None:
    page.wait_for_load_state("networkidle")
    expect(page.locator("html")).to_have_attribute("lang", language)
    screenshot(page, f"lang-{language}-{name}")
    assert_no_serious_a11y_violations(page, f"lang-{language}-{name}")
    if language != "en":
        found = _untranslated(page, allowed=allowed)
        assert not found, f"{name} in {language} shows English UI strings:\n" + "\n".join(found)


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_manager_walk_in_each_language(server, page, project, language):
    world = make_world(project)  # a writer session with a run, reviewers alice and bob, manager mia
    world.gate(reviewers=["alice"])
    # a session no runtime runs yet: its resume page shows the dry run's report, step by step
    fresh = sessions.create_session(orchestrator(project), sessions.NewSession(
        role="writer", memory_policy="session", task_mode="drafting", runtime_family="claude-code"))
    resumed = _resumed_session(project)
    # data: the project's names, a handoff's id, the checkpoint's pending JSON's key (a code) and the writer's
    # token, named after its session's role, in the review gate's "opened by" (an actor's label)
    data = (world.project.name, world.project.slug, "chapter-2/check", '"handoffs"', f"token:writer-{world.writer.id}#")

    _choose(page, server, language)
    _check(page, language, "login")
    _log_in(page, server, "mia")
    expect(page.locator("nav.topnav a")).to_have_text(NAV[language])
    pages = {
        "overview": "/",
        "session": f"/sessions/{world.writer.id}/",
        "project": f"/projects/{world.project.id}/",
        "reviews": "/reviews/gates/",
        "calibration": "/reviews/calibration/",
        "resume": f"/sessions/{world.writer.id}/resume/",
        "resume-report": f"/sessions/{fresh.id}/resume/",
        "session-resumed": f"/sessions/{resumed.id}/",
        "not-found": "/no-such-page/",
    }
    for name, url in pages.items():
        page.goto(server.url + url)
        _check(page, language, f"manager-{name}", allowed=data)
    # the live summaries the script writes say what the server says in the page's language
    page.goto(server.url + f"/sessions/{resumed.id}/")
    for event_type, payload in LIVE_EVENTS:
        live = page.evaluate("([t, p, f]) => NF.describe(t, p, f)", [event_type, payload, family_of(event_type)])
        with translation.override(language):
            assert live == presenters.describe(event_type, payload), (event_type, payload)
        if language == "zh-hans":
            found = [w for w in ("interrupted", "aborted", "external wait", "canon", "resumed", "carried", "generation", "=",
                                 "reviewer", "semantic", "other") if w in live]
            assert not found, f"{live!r} says {found}"
    if language == "zh-hans":
        # the live pieces the scripts write (the connection indicator) are translated too
        expect(page.locator("#conn")).to_have_text("实时")
    mia = get_user_model().objects.get(username="mia")
    assert LanguagePreference.objects.filter(user=mia).count() == 0  # chosen before login: a cookie only


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_reviewer_walk_in_each_language(server, page, project, language):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    lines = CHAPTER.splitlines()
    # the packet (candidate and rubric) is the writer's, shown as written in any language
    packet_text = (*[line for line in lines if line], *[c["label"] for c in RUBRIC["criteria"]],
                   *[c["description"] for c in RUBRIC["criteria"]])

    _choose(page, server, language)
    _log_in(page, server, "alice")
    page.goto(server.url + "/reviews/")
    _check(page, language, "reviewer-queue", allowed=packet_text)
    page.goto(server.url + f"/reviews/packets/{gate.packet.id}/")
    assert page.locator("#L2").inner_text() == lines[1]
    _check(page, language, "reviewer-packet", allowed=packet_text)

    # an answer pasted in the relay box and refused: why, and what was read from it, in the page's language
    page.locator("#relay summary").click()
    page.fill("textarea[name=answer]", 'Here you go: {"decision": "maybe", "confidence": 2}')
    page.locator("form.relay-form button[type=submit]").click()
    page.locator("#relay .refusal").wait_for()
    # the verdict's field names are what the other chat must write: codes, shown as they are
    _check(page, language, "reviewer-relay-refused", allowed=(*packet_text, *VERDICT_FIELDS))

    page.check('input[name="decision"][value="revise"]')
    page.click('label.pip:has(input[name="score-clarity"][value="4"])')
    page.click('label.pip:has(input[name="score-pacing"][value="7"])')
    page.check('input[name="confidence"][value="0.75"]')
    page.locator("form.verdict-form button[type=submit]").click()
    page.locator("#confirmation").wait_for()
    _check(page, language, "reviewer-confirmation", allowed=packet_text)


def test_a_chosen_language_follows_the_person_to_another_browser(server, browser, page, project):
    world = make_world(project)
    world.gate(route="page", reviewers=["alice"])
    page.goto(server.url + "/login/")
    _log_in(page, server, "alice")
    page.get_by_role("button", name="简体中文").click()
    page.wait_for_load_state("networkidle")
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
    expect(page.locator("h1")).to_have_text("审阅队列")
    alice = get_user_model().objects.get(username="alice")
    assert LanguagePreference.objects.get(user=alice).language == "zh-hans"

    other = browser.new_context(viewport={"width": 1366, "height": 768}, locale="en-US")
    try:
        elsewhere = other.new_page()
        elsewhere.goto(server.url + "/login/")
        expect(elsewhere.locator("html")).to_have_attribute("lang", "en")
        _log_in(elsewhere, server, "alice")
        expect(elsewhere.locator("html")).to_have_attribute("lang", "zh-hans")
        screenshot(elsewhere, "lang-remembered-after-login")
    finally:
        other.close()
    assert Membership.objects.filter(user=alice).exists()
