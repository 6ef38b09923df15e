"""Accessibility check for browser tests: axe-core (bundled by axe-playwright-python, offline)
run in the page; fails on any violation of impact "serious" or "critical", naming each rule and
the elements it found. The full axe report is saved next to the screenshots (tests/artifacts)."""
from __future__ import annotations

import json

from axe_playwright_python.sync_playwright import Axe

from tests.browser.conftest import ARTIFACTS

_AXE = Axe()
BLOCKING = ("serious", "critical")


def assert_no_serious_a11y_violations(page, name: str) -> None:
    results = _AXE.run(page)
    violations = results.response.get("violations", [])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"a11y-{name}.json").write_text(json.dumps(violations, indent=2))
    blocking = [v for v in violations if v.get("impact") in BLOCKING]
    assert not blocking, f"{name}: serious/critical accessibility violations:\n" + "\n".join(
        f"- {v['id']} ({v['impact']}): {v['help']} — " + "; ".join(n["target"][0] if isinstance(n["target"][0], str)
                                                                   else str(n["target"]) for n in v["nodes"][:5])
        for v in blocking
    )
