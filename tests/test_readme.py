"""The README's statements about declared data are checked against the code."""
from __future__ import annotations

import re
from pathlib import Path

from novelforge_sessions import lifecycles as lc

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


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
