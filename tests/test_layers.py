"""The layering is a test: core below sessions below control below reviews below the edges.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked by
import-linter from the code's real import graph; a violation fails ``make test`` with the
offending import chain in the message. ``lint-imports`` runs the same check by hand.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
         "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout, proc.stdout[-3000:]
    for contract in ("layers: edges > reviews > control > sessions > core", "no import cycles between sibling modules",
                     "the pure core imports no Django", "the control plane imports nothing from reviews",
                     "the client imports neither Django nor the server's packages"):
        assert contract in proc.stdout, proc.stdout[-3000:]
