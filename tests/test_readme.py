"""The README's statements about declared data are checked against the code."""
from __future__ import annotations

import re
from pathlib import Path

from novelforge_sessions import lifecycles as lc

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _declared_block() -> dict[str, dict[str, set[str]]]:
    block = README.split("The other records (this block is checked", 1)[1].split("```", 2)[1]
    tables: dict[str, dict[str, set[str]]] = {}
    record = None
    for line in block.strip().splitlines():
        head, _, rest = line.partition(":") if not line.startswith(" ") else ("", "", line)
        if head.strip():
            record = head.strip()
        body = rest if head.strip() else line
        for clause in body.split(";"):
            clause = re.sub(r"\([^)]*\)", "", clause).strip()
            if not clause:
                continue
            src, _, targets = clause.partition("→")
            tables.setdefault(record, {})[src.strip()] = {t.strip() for t in targets.split("|") if t.strip()}
    return tables


def test_the_readme_lists_every_lifecycle_as_declared():
    documented = _declared_block()
    for lifecycle in lc.ALL[1:]:
        declared = {s.value: {t.value for t in targets} for s, targets in lifecycle.table.items() if targets}
        assert documented.get(lifecycle.record) == declared, lifecycle.record
    assert set(documented) == {lifecycle.record for lifecycle in lc.ALL[1:]}


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_github_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_section_link_of_the_readmes_names_a_heading():
    """``[…](#x)`` and ``[…](bench/README.md#x)`` land on a heading (a lost one broke #performance)."""
    targets = {"README.md": ROOT / "README.md", "bench/README.md": ROOT / "bench" / "README.md"}
    anchors = {path: _anchors(path) for path in targets.values()}
    checked = 0
    for name, path in targets.items():
        for target, anchor in re.findall(r"\]\(([\w./]*)#([^)]+)\)", path.read_text(encoding="utf-8")):
            linked = path if not target else (path.parent / target).resolve()
            assert linked.exists(), f"{name} links a missing file {target}"
            if linked not in anchors:
                anchors[linked] = _anchors(linked)
            assert anchor in anchors[linked], f"{name} links #{anchor} of {linked.name}, which has no such heading"
            checked += 1
    assert checked >= 10
