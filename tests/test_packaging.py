"""An installed (non-editable) package is self-contained: ``pip install .`` ships
the checkout's top-level ``templates/`` and ``static/`` as package data (``novelforge_sessions/_site/``,
mapped in pyproject.toml), and the pages, static files and ``/api/docs`` with its assets are served
from a folder outside the checkout; the Production section of docs/deployment.md works verbatim on a clean database.

The package is built the way ``python -m build`` / ``pip install`` build it, offline and without the
``wheel`` package: a source distribution from a copy of the sources, then setuptools' ``build_py``
from the unpacked sdist into a temporary folder (``build_py`` lays out exactly the files
``bdist_wheel`` zips: modules and package data). A separate interpreter, run from another temporary
folder, then imports the project only from there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.support.servers import ROOT, free_port

SHIPPED = ("templates", "static", "locale")  # top-level folders of the checkout, shipped as package data
CODE = ("novelforge_sessions", "reviews", "novelforge_client")
SOURCES = ("pyproject.toml", "README.md", *CODE, *SHIPPED)  # what a clean clone gives setuptools
SITE = Path("novelforge_sessions") / "_site"  # where the installed package carries SHIPPED


def _setup(cwd: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _setup(src, "sdist", "--formats=gztar", "--dist-dir", str(dist))
    (archive,) = dist.glob("*.tar.gz")
    unpacked = tmp_path_factory.mktemp("sdist")
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (sdist_root,) = unpacked.iterdir()
    lib = tmp_path_factory.mktemp("site")
    _setup(sdist_root, "build_py", "--build-lib", str(lib))
    return lib


def _files(base: Path, pattern: str = "*") -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_package_ships_every_template_and_static_file(built):
    for folder in SHIPPED:
        in_checkout = _files(ROOT / folder)
        assert in_checkout, folder
        assert _files(built / SITE / folder) == in_checkout, folder
    assert (built / SITE / "templates" / "registration" / "login.html").is_file()
    assert (built / SITE / "static" / "js" / "session.js").is_file()
    assert not (built / "templates").exists() and not (built / "static").exists(), "no top-level names"


def test_the_package_ships_every_module(built):
    """pyproject.toml lists the packages (a `find` cannot be combined with the `_site` mapping): a new
    subpackage missing from the list is caught here."""
    for package in CODE:
        shipped = _files(built / package, "*.py") - _files(built / package, "_site/**/*.py")
        assert shipped == _files(ROOT / package, "*.py"), package
    assert (built / "novelforge_client" / "py.typed").is_file(), "the client's types ship with it (PEP 561)"


def test_every_template_and_static_folder_is_a_listed_package():
    """setuptools only keeps data in folders listed as packages (it includes unlisted ones with a
    deprecation warning today): every folder under templates/ and static/ is in `packages`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    for folder in SHIPPED:
        package = f"novelforge_sessions._site.{folder}"
        assert config["package-dir"][package] == folder
        assert config["package-data"][package] == ["**/*"]
        for sub in [ROOT / folder, *sorted(p for p in (ROOT / folder).rglob("*") if p.is_dir())]:
            name = ".".join([package, *sub.relative_to(ROOT / folder).parts])
            assert name in config["packages"], f"add {name!r} to [tool.setuptools] packages"


def test_the_checkout_reads_its_own_top_level_folders_and_collectstatic_works(tmp_path):
    from django.conf import settings

    assert settings.SITE_DIR == ROOT
    assert settings.TEMPLATES[0]["DIRS"] == [ROOT / "templates"]
    assert settings.STATICFILES_DIRS == [ROOT / "static"]
    env = dict(os.environ, STATIC_ROOT=str(tmp_path / "collected"))
    proc = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = _files(tmp_path / "collected")
    assert _files(ROOT / "static") <= collected  # ours, from the top-level static/
    assert {"ninja/swagger-ui-bundle.js", "ninja/swagger-ui.css", "css/app.css.gz"} <= collected


def test_the_installed_package_serves_pages_static_files_and_docs_from_outside_the_checkout(built, tmp_path):
    probe = textwrap.dedent(
        """
        import re, sys
        from pathlib import Path
        import django
        django.setup()
        import novelforge_sessions
        from django.conf import settings
        from django.template.loader import get_template
        from django.test import Client
        lib = Path(sys.argv[1]).resolve()
        assert Path(novelforge_sessions.__file__).resolve().is_relative_to(lib), novelforge_sessions.__file__
        c = Client()
        login = c.get("/login/")
        assert login.status_code == 200, login.status_code
        css = re.findall(r'href="(/static/[^"]+[.]css)"', login.content.decode())
        assert css, login.content[:500]
        docs = c.get("/api/docs")
        assert docs.status_code == 200, docs.status_code
        page = docs.content.decode()
        assert not re.findall(r'(?:src|href)="(?:https?:)?//', page), "nothing from a CDN"
        assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
        assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets), assets
        for url in css + assets + ["/static/js/session.js", "/static/js/dashboard.js"]:
            response = c.get(url)
            assert response.status_code == 200, url
            body = b"".join(response.streaming_content) if response.streaming else response.content
            assert body, url
        origin = Path(get_template("registration/login.html").origin.name).resolve()
        assert origin == lib / "novelforge_sessions" / "_site" / "templates" / "registration" / "login.html", origin
        assert settings.SITE_DIR == lib / "novelforge_sessions" / "_site", settings.SITE_DIR
        print("served", len(css + assets) + 2, "static files")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE"}}
    env.update(PYTHONPATH=str(built), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings")
    proc = subprocess.run([sys.executable, "-c", probe, str(built)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "served" in proc.stdout


def _production_block() -> str:
    page = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    return page.split("\n## Production\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_production_section_works_on_a_clean_database(built, tmp_path):
    """docs/deployment.md, Production: from `createdb` to a served request, run as written (the installed package
    from outside the checkout; only the placeholder exports, the port and `pip install .` differ)."""
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = f"nf_readme_{uuid.uuid4().hex[:10]}"
    port = free_port()
    lines, placeholders = [], []
    for line in _production_block().splitlines():
        if line == "pip install .":
            continue  # the package is `built` (PYTHONPATH below)
        if line.startswith("export ") and "…" in line:
            placeholders.append(line)  # the test provides these values
            continue
        lines.append(line)
    assert len(placeholders) == 3, placeholders
    assert lines.index("createdb") < lines.index("python -m django migrate --noinput"), "the database first"
    script = "\n".join(lines)
    assert script.count("python -m novelforge_sessions.serve --host 0.0.0.0 --port 8000 ") == 1
    assert script.count("http://127.0.0.1:8000/") == 1
    script = script.replace("--host 0.0.0.0 --port 8000 ", f"--host 127.0.0.1 --port {port} ").replace(
        "http://127.0.0.1:8000/", f"http://127.0.0.1:{port}/")
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DATABASE_URL", "REDIS_URL"}}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(built),
        PGHOST=db.get("HOST") or "127.0.0.1", PGPORT=str(db.get("PORT") or 5432),
        PGUSER=db.get("USER") or "postgres", PGPASSWORD=db.get("PASSWORD") or "", PGDATABASE=name,
        SECRET_KEY="readme-check-" + uuid.uuid4().hex + uuid.uuid4().hex,
        ALLOWED_HOSTS="127.0.0.1,localhost", STATIC_ROOT=str(tmp_path / "static"),
        NOVELFORGE_PASSWORD_ALICE="alice-secret-pass", NOVELFORGE_PASSWORD_BOB="bob-secret-pass",
        NOVELFORGE_PASSWORD_CAROL="carol-secret-pass",
    )
    maintenance = f"host={env['PGHOST']} port={env['PGPORT']} user={env['PGUSER']} dbname=postgres"
    if env["PGPASSWORD"]:
        maintenance += f" password={env['PGPASSWORD']}"
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail("the production section did not finish:\n" + out)
    finally:
        try:
            os.killpg(proc.pid, 15)  # the server and the reconciler, if the trap did not reach them
        except ProcessLookupError:
            pass
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert proc.returncode == 0, out
    # curl's answer (the server's shutdown lines may follow it on the shared output)
    assert '{"items": [], "next_after": null}' in out, out
    assert "project my-novel created" in out and "carol is now reviewer of my-novel" in out
    assert (tmp_path / "static" / "css" / "app.css").is_file(), "collectstatic used STATIC_ROOT"
    assert (tmp_path / "static" / "ninja" / "swagger-ui-bundle.js").is_file()
