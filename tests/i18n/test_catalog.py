"""The translation catalogs (locale/, docs/pages.md#language): every message the pages mark has a
Simplified Chinese translation, none fuzzy, with the same placeholders (msgfmt --check); the
catalogs hold exactly what the sources mark today (makemessages run afresh finds nothing new and
nothing gone); the compiled catalogs are never committed."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.support.servers import ROOT

LOCALE = ROOT / "locale"
CATALOGS = sorted(LOCALE.glob("*/LC_MESSAGES/*.po"))
#: what makemessages reads (the Makefile's `messages` ignores everything else): the pages' templates,
#: the server's Python and the pages' scripts.
SOURCES = ("templates", "static", "novelforge_sessions", "reviews")


def _entries(path: Path) -> dict[str, str]:
    """msgid → msgstr of a .po file, via msgcat's one-line form (no wrapping) so the parse is plain."""
    flat = subprocess.run(["msgcat", "--no-wrap", "--no-location", str(path)], capture_output=True,
                          text=True, check=True).stdout
    entries, msgid, plural = {}, None, None
    for line in flat.splitlines():
        if line.startswith("msgid "):
            msgid, plural = _unquote(line[6:]), None
        elif line.startswith("msgid_plural "):
            plural = _unquote(line[13:])
        elif line.startswith("msgctxt "):
            continue
        elif line.startswith(("msgstr ", "msgstr[0] ")) and msgid:
            entries[msgid if plural is None else f"{msgid}|{plural}"] = _unquote(line.split(" ", 1)[1])
    return entries


def _unquote(quoted: str) -> str:
    return quoted.strip()[1:-1].encode().decode("unicode_escape").encode("latin-1").decode()


def test_there_is_a_simplified_chinese_catalog_for_the_pages_and_their_scripts():
    names = {p.relative_to(LOCALE).as_posix() for p in CATALOGS}
    assert "zh_Hans/LC_MESSAGES/django.po" in names
    assert "zh_Hans/LC_MESSAGES/djangojs.po" in names


@pytest.mark.parametrize("catalog", CATALOGS, ids=lambda p: p.relative_to(LOCALE).as_posix())
def test_every_message_is_translated_none_fuzzy_and_placeholders_agree(catalog):
    check = subprocess.run(["msgfmt", "--check", "--statistics", "-o", "/dev/null", str(catalog)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "fuzzy" not in check.stderr and "untranslated" not in check.stderr, check.stderr
    entries = _entries(catalog)
    assert len(entries) > 0
    empty = [m for m, t in entries.items() if not t.strip()]
    assert not empty, f"untranslated in {catalog.name}: {empty}"
    # a translation is Chinese, not the English copied over (short names such as "OK" aside)
    same = [m for m, t in entries.items() if t == m and re.search(r"[a-z]{3,}", m)]
    assert not same, f"copied, not translated, in {catalog.name}: {same}"


def test_the_catalogs_hold_exactly_what_the_sources_mark(tmp_path, monkeypatch):
    """makemessages run afresh (on a copy of the sources, into a scratch folder: run in the checkout
    it would merge into locale/) finds the same messages as the committed catalogs: no marked string
    is missing from them and none is left over."""
    src, out = tmp_path / "src", tmp_path / "out"
    for name in SOURCES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "_site"))
    monkeypatch.chdir(src)
    with override_settings(LOCALE_PATHS=[out]):
        for domain in ("django", "djangojs"):
            call_command("makemessages", locale=["zh_Hans"], domain=domain, add_location="never", verbosity=0)
    for domain in ("django", "djangojs"):
        fresh = set(_entries(out / "zh_Hans" / "LC_MESSAGES" / f"{domain}.po")) - {""}
        committed = set(_entries(LOCALE / "zh_Hans" / "LC_MESSAGES" / f"{domain}.po")) - {""}
        assert fresh, domain
        assert fresh - committed == set(), f"{domain}: marked but not in the catalog (run make messages)"
        assert committed - fresh == set(), f"{domain}: in the catalog but no longer marked (run make messages)"


def test_compiled_catalogs_are_not_committed_and_are_ignored():
    tracked = subprocess.run(["git", "ls-files", "*.mo"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout.strip() == ""
    ignored = subprocess.run(["git", "check-ignore", "-q", "locale/zh_Hans/LC_MESSAGES/django.mo"], cwd=ROOT)
    assert ignored.returncode == 0
