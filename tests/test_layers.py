"""The layering is a test: core below sessions below control below reviews below the shared HTTP
kit below the edges below the composition root.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked by
import-linter from the code's real import graph; a violation fails ``make test`` with the
offending import chain in the message. ``lint-imports`` runs the same check by hand.
"""
from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
import tomllib
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
    for contract in ("layers: root > edges > HTTP kit > reviews > control > sessions > core",
                     "no import cycles between sibling modules", "the apps' API routers import neither each other",
                     "the shared HTTP kit imports no app above the sessions",
                     "the pure core imports no Django", "the control plane imports nothing from reviews",
                     "the client imports neither Django nor the server's packages"):
        assert contract in proc.stdout, proc.stdout[-3000:]


def _layered_modules() -> tuple[set[str], set[str]]:
    """The modules the layers contract names: (all of them, the optional ones in parentheses)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c for c in config["contracts"] if c["type"] == "layers"]
    named, optional = set(), set()
    for layer in layers["layers"]:
        for entry in re.split(r"[:|]", layer):
            name = entry.strip()
            if name.startswith("(") and name.endswith(")"):
                name = name[1:-1].strip()
                optional.add(name)
            named.add(name)
    return named, optional


def test_every_top_level_module_of_the_server_packages_is_in_a_layer():
    """A new module (or package) of ``novelforge_sessions`` or ``reviews`` must be given its layer:
    one left out would be outside every arrow the contract checks."""
    named, optional = _layered_modules()
    present = set()
    for package in ("novelforge_sessions", "reviews"):
        for module in pkgutil.iter_modules([str(ROOT / package)]):
            present.add(f"{package}.{module.name}")
    assert sorted(present - named) == [], "name these in the layers contract of pyproject.toml"
    assert sorted(named - present - optional) == [], "the layers contract names modules that do not exist"
