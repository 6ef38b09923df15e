"""The README and the pages under docs/ are checked against the code: the lifecycles they list,
the links between them, and the commands and files the README shows."""
from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

from novelforge_sessions import lifecycles as lc

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The README is the newcomer's page; the rest lives under docs/.
README_MAX_LINES = 350


def _pages() -> list[Path]:
    """Every Markdown page a reader follows links between."""
    return [README, ROOT / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]


def _declared_block() -> dict[str, dict[str, set[str]]]:
    text = (DOCS / "lifecycles.md").read_text(encoding="utf-8")
    block = text.split("The other records (this block is checked", 1)[1].split("```", 2)[1]
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


def test_the_lifecycles_page_lists_every_lifecycle_as_declared():
    documented = _declared_block()
    for lifecycle in lc.ALL[1:]:
        declared = {s.value: {t.value for t in targets} for s, targets in lifecycle.table.items() if targets}
        assert documented.get(lifecycle.record) == declared, lifecycle.record
    assert set(documented) == {lifecycle.record for lifecycle in lc.ALL[1:]}


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"


# ---- links ---------------------------------------------------------------------------------------------
def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _without_code(text: str) -> str:
    """The text outside fenced blocks and inline code (a link or heading inside code is not one)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", text)


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_github_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(path: Path) -> list[tuple[str, str]]:
    """Every relative Markdown link of the page as (file, anchor); either may be empty."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        found.append((file, anchor))
    return found


def test_every_relative_link_of_the_pages_names_a_file_and_a_heading():
    """``[…](docs/api.md)``, ``[…](#x)`` and ``[…](api.md#x)`` land on a file and a heading, in the
    README, bench/README.md and every page of docs/ (a lost heading once broke #performance)."""
    anchors: dict[Path, set[str]] = {}
    files = anchors_checked = 0
    for page in _pages():
        name = page.relative_to(ROOT)
        for target, anchor in _links(page):
            linked = page if not target else (page.parent / target).resolve()
            if linked == DOCS / "model.md" and not linked.exists():
                continue  # written on another branch; checked like any page once it is here
            assert linked.exists(), f"{name} links a missing file {target}"
            assert ROOT in linked.parents, f"{name} links {target}, outside the repository"
            files += 1
            if not anchor:
                continue
            assert linked.suffix == ".md", f"{name} links #{anchor} of {target}, which is not a page"
            if linked not in anchors:
                anchors[linked] = _anchors(linked)
            assert anchor in anchors[linked], f"{name} links #{anchor} of {linked.name}, which has no such heading"
            anchors_checked += 1
    assert files >= 30 and anchors_checked >= 20, (files, anchors_checked)


def test_the_readme_links_every_page_of_docs():
    linked = {(README.parent / target).resolve() for target, _ in _links(README) if target}
    missing = [p.name for p in DOCS.glob("*.md") if p not in linked]
    assert not missing, f"README.md links no {missing}"


# ---- the README's commands -----------------------------------------------------------------------------
def _shell_lines(path: Path) -> list[str]:
    """The commands of the page's ``sh`` blocks, comments and continuation lines joined."""
    text = path.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                lines.append(line)
    return lines


def _inline_commands(path: Path) -> list[str]:
    """The commands the page shows in inline code (`make run RUN_PORT=8123`, `python -m django migrate`)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", text)
    return [s for s in spans if s.startswith(("make ", "python ", "python3 ", "manage.py ", ".venv/bin/"))]


def _commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split on ``&&``, ``;``, ``|``, ``&``, ``$(…)``)."""
    line = line.replace("$(", " ; ").replace(")\"", " ").replace("…", "x")
    words = shlex.split(line, posix=True)
    commands, current = [], []
    for word in words:
        if word in {"&&", ";", "|", "&", "||"}:
            commands.append(current)
            current = []
        else:
            current.append(word.rstrip(";&"))
            if word.endswith((";", "&")):
                commands.append(current)
                current = []
    commands.append(current)
    return [c for c in commands if c]


def _without_env(command: list[str]) -> list[str]:
    """The command after its leading ``NAME=value`` assignments (and ``export`` has none to run)."""
    i = 0
    while i < len(command) and re.match(r"^[A-Z_][A-Z0-9_]*=", command[i]):
        i += 1
    return command[i:]


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def _management_commands() -> set[str]:
    from django.core.management import get_commands

    return set(get_commands())


def _console_scripts() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"])


def test_every_command_the_readme_shows_still_exists():
    """In the ``sh`` blocks and in inline code: each ``make X`` is a Makefile target, each
    ``python -m M`` an importable module, each ``manage.py C`` / ``python -m django C`` a management
    command, each script a file or an entry point."""
    targets, commands, scripts = _make_targets(), _management_commands(), _console_scripts()
    seen = {"make": 0, "module": 0, "command": 0, "script": 0}
    for line in _shell_lines(README) + _inline_commands(README):
        for command in map(_without_env, _commands(line)):
            if not command:
                continue
            program, args = Path(command[0]).name, command[1:]
            if program == "manage.py":
                program, args = "python", command
            if program == "make":
                for target in (a for a in args if "=" not in a and not a.startswith("-")):
                    assert target in targets, f"README runs `make {target}`, which the Makefile does not have"
                    seen["make"] += 1
            elif program.startswith("python"):
                if args[:1] == ["-m"]:
                    module = args[1]
                    assert importlib.util.find_spec(module) is not None, f"README runs `python -m {module}`"
                    seen["module"] += 1
                    if module == "django" and args[2:]:
                        assert args[2] in commands, f"README runs `python -m django {args[2]}`"
                        seen["command"] += 1
                elif args and args[0].endswith(".py"):
                    script = args[0]
                    assert (ROOT / script).is_file(), f"README runs {script}, which does not exist"
                    if script.endswith("manage.py") and args[1:]:
                        assert args[1] in commands, f"README runs `manage.py {args[1]}`"
                        seen["command"] += 1
                    seen["script"] += 1
            elif command[0].startswith(".venv/bin/"):
                assert program in scripts, f"README runs {command[0]}, which pyproject.toml does not install"
                seen["script"] += 1
    assert seen["make"] >= 5 and seen["module"] >= 3 and seen["command"] >= 3 and seen["script"] >= 2, seen


_REPO_DIRS = ("novelforge_sessions", "novelforge_client", "reviews", "tests", "bench", "harness", "scripts",
              "deploy", "examples", "templates", "static", "docs")
#: Paths that exist only once something ran: the installed package's data, the browser tests' output.
_MADE_LATER = ("novelforge_sessions/_site", "tests/artifacts")


def _mentioned_paths(path: Path) -> set[str]:
    """Repository paths the page names in inline code or in its ``sh`` blocks."""
    text = path.read_text(encoding="utf-8")
    words = set(re.findall(r"`([^`\s]+)`", text))
    for line in _shell_lines(path):
        words.update(line.split())
    found = set()
    for word in words:
        word = word.removeprefix("$PWD/").strip("\"'(),;:")
        if any(c in word for c in "<>*…{}$=") or not word.startswith(tuple(d + "/" for d in _REPO_DIRS)):
            continue
        found.add(word.split("#", 1)[0].split(":", 1)[0])
    return found


def test_every_file_the_pages_name_exists():
    checked = 0
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for mentioned in _mentioned_paths(page):
            if mentioned.startswith(_MADE_LATER):
                continue
            assert (ROOT / mentioned).exists(), f"{page.relative_to(ROOT)} names {mentioned}, which does not exist"
            checked += 1
    assert checked >= 50, checked
