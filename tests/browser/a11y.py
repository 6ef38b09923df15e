"""Accessibility checks in the browser: axe-core (bundled by axe-playwright-python, runs offline)
against the page as it is now. A page passes with 0 violations of impact ``serious`` or
``critical``; the full list (all impacts) is written next to the screenshots as
``tests/artifacts/a11y-<name>.json`` so a person can read the minor ones too.

Axe is injected through Playwright's ``evaluate`` (the DevTools protocol), which the page's
Content-Security-Policy does not govern: the check needs no loosening of the policy.
"""
from __future__ import annotations

import json

from axe_playwright_python.sync_playwright import Axe

from tests.browser.conftest import ARTIFACTS

BLOCKING = frozenset({"serious", "critical"})
_AXE = Axe()


def assert_no_serious_a11y_violations(page, name: str) -> list[dict]:
    """Run axe-core on ``page``; fail listing every serious or critical violation (rule, impact,
    help and the offending nodes). Returns all violations found (any impact)."""
    results = _AXE.run(page, options={"resultTypes": ["violations"]})
    violations = results.response["violations"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"a11y-{name}.json").write_text(json.dumps(
        [{"id": v["id"], "impact": v["impact"], "help": v["help"], "nodes": [n["target"] for n in v["nodes"]]}
         for v in violations], indent=2))
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"{name}: serious/critical accessibility violations:\n" + "\n".join(
        f"- {v['id']} ({v['impact']}): {v['help']} — " + "; ".join(
            " ".join(n["target"]) + (f" [{n.get('failureSummary', '').strip()}]" if n.get("failureSummary") else "")
            for n in v["nodes"][:5])
        for v in blocking)
    return violations
