"""The repository stands alone: code, tests, pages and docs cite only what is in it.

A comment that cites a section of some other document is useless to a reader who does not have that
document, and it rots silently when the document changes. So nothing tracked here cites a
document outside the repository (a design brief, a contract's section numbers, a pitfalls
list, an issue tracker's or an audit report's numbers); the model is written down in ``docs/model.md`` and cited by
its headings' anchors, and every anchor of that page cited anywhere must resolve to one of
its headings.

The forbidden spellings are assembled from pieces below, so that this file does not match
them itself.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = [
    "novelforge_sessions", "reviews", "novelforge_client", "harness", "bench", "scripts",
    "examples", "tests", "templates", "static", "docs", "README.md",
]
MODEL = ROOT / "docs" / "model.md"

SECTION = "\u00a7"


def cat(*parts: str) -> str:
    """Join at run time: Python folds ``"a" + "b"`` into one constant in the bytecode, and the
    compiled file would then hold the very spellings this test forbids."""
    return "".join(parts)


#: name → pattern of a citation of something outside the repository.
OUTSIDE = {
    "design brief section": re.compile(cat("DES", r"IGN\s*", SECTION), re.I),
    "contract section": re.compile(cat("con", r"tract\s*", SECTION), re.I),
    "bare section number": re.compile(cat(r"(?<!RFC \d\d\d\d )", SECTION, r"\s*\d")),
    "pitfalls list": re.compile(cat("PIT", "FALLS")),
    "design brief": re.compile(cat("DES", r"IGN\.md"), re.I),
    "UI or style brief": re.compile(cat(r"\b(?:U", r"I|STY", r"LE)\.md\b")),
    "shared folder": re.compile(cat(r"\.\./", "sha", "red|/work/", "sha", "red")),
    "issue number": re.compile(cat(r"\biss", r"ue\s*#?\d"), re.I),
    "seed number": re.compile(cat(r"\bse", r"ed\s*\d"), re.I),
    "audit report finding": re.compile(
        cat(r"\baud", r"it(?:'s)?\s+(?:findings?|reproduction|request|ordering)\b",
            r"|\b(?:lifecycle|security)\s+aud", r"it\b|\boutside (?:security )?aud", r"it\b(?! polling)",
            r"|\bfin", r"dings?\s+F\d|\bdef", r"ect\s+\d"),
        re.I,
    ),
}
ANCHOR_CITATION = re.compile(r"docs/model\.md#([A-Za-z0-9_-]+)")
#: In docs/model.md itself, links to its own headings: ``(#anchor)``.
OWN_ANCHOR = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")


def tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name]


def text_of(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # deleted in the work tree, not yet in the index
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped except ``-`` and ``_``,
    spaces to ``-``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def model_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", MODEL.read_text(encoding="utf-8"), re.M)
    return {github_slug(h) for h in headings}


def test_the_patterns_catch_what_they_are_for():
    """Each pattern matches the citation it exists for (so a pass below means something), and
    leaves alone what is not one (an RFC's section, an issue of a magazine, a random seed)."""
    samples = {
        "design brief section": cat("see DES", "IGN ", SECTION, "13"),
        "contract section": cat("(Con", "tract ", SECTION, "08)"),
        "bare section number": cat("the ", SECTION, "07 act"),
        "pitfalls list": cat("(PIT", "FALLS.md)"),
        "design brief": cat("read DES", "IGN.md"),
        "UI or style brief": cat("(U", "I.md: words)"),
        "shared folder": cat("../sha", "red/seeds"),
        "issue number": cat("(iss", "ue #8)"),
        "seed number": cat("Se", "ed 003's operations"),
        "audit report finding": cat("(lifecycle aud", "it F2)"),
    }
    for name, sample in samples.items():
        assert OUTSIDE[name].search(sample), (name, sample)
    fine = [cat("UTF-8 without a BOM (RFC 8259 ", SECTION, "8.1)"), "the issue is the lease", "seed=None",
            cat("an outside aud", "it polling the list"), "Finding 1: Line 99", cat("docs/model.md", "#resume")]
    for text in fine:
        assert not any(p.search(text) for p in OUTSIDE.values()), text


def test_nothing_cites_a_document_outside_the_repository():
    found = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for name, pattern in OUTSIDE.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{lineno}: {name}: {line.strip()[:120]}")
    assert not found, "cite a heading of docs/model.md, a module or a test instead:\n" + "\n".join(found)


def test_github_slug_follows_githubs_rules():
    assert github_slug("Sessions and their lifecycle") == "sessions-and-their-lifecycle"
    assert github_slug("Results and idempotent delivery") == "results-and-idempotent-delivery"
    assert github_slug("Runtimes, leases & fencing") == "runtimes-leases--fencing"
    assert github_slug("The `one_rule` (v2)") == "the-one_rule-v2"


def test_the_model_page_has_the_headings_code_relies_on():
    anchors = model_anchors()
    for anchor in ("identities", "session-lifecycle", "runs", "checkpoints", "resume",
                   "runtimes-and-leases", "results-and-idempotent-delivery", "invariants"):
        assert anchor in anchors, anchor


def test_every_cited_model_anchor_resolves_to_a_heading():
    anchors = model_anchors()
    cited, broken = 0, []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        patterns = [ANCHOR_CITATION] + ([OWN_ANCHOR] if path == MODEL else [])
        for lineno, line in enumerate(text.splitlines(), 1):
            for pattern in patterns:
                for anchor in pattern.findall(line):
                    cited += 1
                    if anchor not in anchors:
                        broken.append(f"{path.relative_to(ROOT)}:{lineno}: #{anchor}")
    assert cited > 0, "no file cites docs/model.md: the scan found nothing to check"
    assert not broken, f"anchors with no heading in docs/model.md {sorted(anchors)}:\n" + "\n".join(broken)


def test_the_modules_and_tests_the_model_page_names_exist():
    """The page proves its rules by naming where they are enforced; a renamed module or test
    must not leave it pointing at nothing."""
    named = re.findall(r"`((?:novelforge_sessions|reviews|tests)/[\w/]+\.py)`", MODEL.read_text(encoding="utf-8"))
    assert named, "docs/model.md names no module or test"
    missing = sorted({path for path in named if not (ROOT / path).is_file()})
    assert not missing, missing
