"""A session's role in the page's language (docs/pages.md#language): the overview's role column and its
filter, a row fetched live, the session page's identity panel and the ``session.created`` summary say
"语义审阅者", not "semantic_reviewer", on a Simplified Chinese page; the code stays in ``data-role`` and
``title`` and in the filter's values. A role ``other``'s extension name is the agent's own, shown as
written; so are the summary's task mode and runtime family. The live pages' script says the same from
the same map (tests/browser/test_languages.py, tests/browser/test_dashboard.py)."""
from __future__ import annotations

import json
import re

import pytest
from django.utils import translation

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.dashboard import presenters
from tests.dashboard.conftest import logged_in, make_user
from tests.dashboard.conftest import make_session  # noqa: F401 (the manager pages' fixture)
from tests.i18n.test_refusal_pages import chinese, shown

pytestmark = pytest.mark.django_db

CREATED = {"role": "semantic_reviewer", "memory_policy": "none", "task_mode": "chapter_check",
           "runtime_family": "claude-code", "status": "created"}


def role_cell(markup: str, session_id: int) -> str:
    """The role cell of a session's row in the overview."""
    row = re.search(rf'<tr id="session-{session_id}".*?</tr>', markup, re.S)
    assert row, f"session {session_id} has a row"
    return re.search(r'<td class="clip role".*?</td>', row.group(0), re.S).group(0).strip()


def test_every_role_has_words_and_they_are_translated():
    assert set(presenters.ROLE_WORDS) == set(rt.SessionRole)
    assert presenters.role_words("semantic_reviewer") == "semantic reviewer"
    assert presenters.role_words("writer") == "writer"
    assert presenters.role_words("some_new_role") == "some new role"  # unknown: the code, spaced
    with translation.override("zh-hans"):
        said = {r.value: presenters.role_words(r) for r in rt.SessionRole}
        assert said == {"manager": "管理者", "writer": "写作者", "specialist": "专家", "semantic_reviewer": "语义审阅者",
                        "human_reviewer": "人工审阅者", "other": "其他"}
        assert presenters.words()["roles"] == said  # the live pages' map (NF.roleWords)


def test_the_session_created_summary_says_the_role_in_words_in_both_languages():
    assert presenters.describe("session.created", CREATED) == "semantic reviewer · chapter_check · claude-code"
    with translation.override("zh-hans"):
        # the task mode and the runtime family are the agent's own names: as written
        assert presenters.describe("session.created", CREATED) == "语义审阅者 · chapter_check · claude-code"
        assert presenters.describe("session.created", {**CREATED, "role": "writer"}) == "写作者 · chapter_check · claude-code"


def test_the_overview_says_roles_in_chinese_and_keeps_the_codes(project, make_session):
    writer = make_session()
    reviewer = make_session(role="semantic_reviewer", memory_policy="none", task_mode="chapter_check")
    illustrator = make_session(role="other", role_extension="illustrator_v2")
    boss = chinese(logged_in(make_user("boss", project)))
    page = boss.get("/")
    html, text = page.content.decode(), shown(page)
    assert role_cell(html, writer.id) == '<td class="clip role" data-role="writer" title="writer">写作者</td>'
    assert role_cell(html, reviewer.id) == (
        '<td class="clip role" data-role="semantic_reviewer" title="semantic_reviewer">语义审阅者</td>')
    # the extension is the agent's own name, as written; the code and the name stay in the title
    assert role_cell(html, illustrator.id) == ('<td class="clip role" data-role="other" title="other:illustrator_v2">'
                                               '其他：<span class="muted">illustrator_v2</span></td>')
    # the filter: the code as the option's value, the words as its label
    assert '<option value="semantic_reviewer">语义审阅者</option>' in html
    assert '<option value="human_reviewer">人工审阅者</option>' in html
    # the feed's session.created lines
    assert "语义审阅者 · chapter_check · claude-code" in text and "写作者 · drafting · claude-code" in text
    assert "其他 · drafting · claude-code" in text
    for code in ("semantic_reviewer", "human_reviewer", "semantic reviewer", "writer", "specialist", "other"):
        assert not re.search(rf"(?<![\w-]){code}(?![\w-])", text), code
    # the live pages' map says the same
    words = json.loads(re.search(r'<script id="nf-words" type="application/json">(.*?)</script>', html, re.S).group(1))
    assert words["roles"]["semantic_reviewer"] == "语义审阅者"

    filtered = boss.get("/?role=semantic_reviewer").content.decode()
    assert re.findall(r'<tr id="session-(\d+)"', filtered) == [str(reviewer.id)]
    assert '<option value="semantic_reviewer" selected>语义审阅者</option>' in filtered

    # a row re-rendered for the live overview (overview.js fetches it after an event) says the same
    fetched = boss.get(f"/sessions/{reviewer.id}/row/").content.decode()
    assert role_cell(fetched, reviewer.id) == (
        '<td class="clip role" data-role="semantic_reviewer" title="semantic_reviewer">语义审阅者</td>')


def test_the_overview_in_english_says_roles_in_words(project, make_session):
    mgr_client = logged_in(make_user("boss", project))
    reviewer = make_session(role="human_reviewer", memory_policy="none")
    illustrator = make_session(role="other", role_extension="illustrator")
    html = mgr_client.get("/").content.decode()
    assert role_cell(html, reviewer.id) == (
        '<td class="clip role" data-role="human_reviewer" title="human_reviewer">human reviewer</td>')
    assert role_cell(html, illustrator.id) == ('<td class="clip role" data-role="other" title="other:illustrator">'
                                               'other: <span class="muted">illustrator</span></td>')
    assert '<option value="human_reviewer">human reviewer</option>' in html
    assert "human reviewer · drafting · claude-code" in shown(mgr_client.get("/"))


def test_the_session_page_says_the_role_in_chinese(project, make_session):
    reviewer = make_session(role="semantic_reviewer", memory_policy="none", task_mode="chapter_check")
    boss = chinese(logged_in(make_user("boss", project)))
    page = boss.get(f"/sessions/{reviewer.id}/")
    html, text = page.content.decode(), shown(page)
    assert '<dd data-role="semantic_reviewer" title="semantic_reviewer">语义审阅者</dd>' in html
    assert "语义审阅者 · chapter_check · claude-code" in text  # the feed's session.created
    assert "semantic_reviewer" not in text and "semantic reviewer" not in text

    other = make_session(role="other", role_extension="illustrator")
    html = boss.get(f"/sessions/{other.id}/").content.decode()
    assert '<dd data-role="other" title="other:illustrator">其他：<span class="muted">illustrator</span></dd>' in html


def test_every_memory_policy_has_plain_words_in_both_languages():
    assert set(presenters.MEMORY_POLICY_WORDS) == set(rt.MemoryPolicy)
    assert presenters.memory_policy_words("checkpoint_only") == "keeps only its checkpoints"
    assert presenters.memory_policy_words("a_new_policy") == "a new policy"  # unknown: the code, spaced
    with translation.override("zh-hans"):
        said = {p.value: presenters.memory_policy_words(p) for p in rt.MemoryPolicy}
    assert all(words and not re.search(r"[A-Za-z]", words) for words in said.values()), said
    assert len(set(said.values())) == len(said)  # no two policies say the same


def test_the_identity_panel_says_the_memory_policy_in_words_and_keeps_the_code(project, make_session):
    reviewer = make_session(role="semantic_reviewer", memory_policy="none", task_mode="chapter_check")
    page = logged_in(make_user("boss", project)).get(f"/sessions/{reviewer.id}/")
    assert ('<dd data-memory-policy="none" title="none">keeps nothing between invocations</dd>'
            in page.content.decode())
    page = chinese(logged_in(make_user("chief", project))).get(f"/sessions/{reviewer.id}/")
    html = page.content.decode()
    assert '<dd data-memory-policy="none" title="none">两次调用之间不保留任何内容</dd>' in html
