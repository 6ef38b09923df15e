"""Deployment security: the production profile of docs/deployment.md passes
``manage.py check --deploy --fail-level WARNING`` with no warning (and the defaults do not, so the
test can fail); the HTTPS settings come from the environment, strictly parsed; the probes answer
over plain HTTP behind the SSL redirect; every page sends a strict Content-Security-Policy with a
per-response nonce, and no template carries inline script, style attributes or event handlers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.test import Client, override_settings

from tests.reviews.factories import World, make_world

ROOT = Path(__file__).resolve().parent.parent


def _profile() -> dict[str, str]:
    """The env vars of the "HTTPS: the production profile" block of docs/deployment.md."""
    page = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    block = page.split("\n## HTTPS: the production profile\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    env: dict[str, str] = {}
    for line in block.splitlines():
        assert line.startswith("export "), line
        for pair in line.removeprefix("export ").split():
            key, value = pair.split("=", 1)
            env[key] = value
    return env


def _check_deploy(extra: dict[str, str]) -> subprocess.CompletedProcess:
    # Not the test process's own knobs (another test module sets DJANGO_ALLOW_ASYNC_UNSAFE, async.E001).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SECURE_", "SESSION_COOKIE_", "CSRF_", "DJANGO_"))
           and k not in {"SECRET_KEY", "REQUIRE_SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}}
    env.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings", **extra)
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _production() -> dict[str, str]:
    # As the Production exports of docs/deployment.md: an own key and the real host name.
    return {"SECRET_KEY": "prod-" + uuid.uuid4().hex + uuid.uuid4().hex, "ALLOWED_HOSTS": "runtime.example.org",
            "REQUIRE_SECRET_KEY": "true", **_profile()}


def test_the_production_profile_passes_check_deploy_with_no_warning():
    proc = _check_deploy(_production())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "System check identified no issues" in out and "WARNING" not in out, out


def test_a_generated_secret_key_passes_check_deploy_and_a_short_one_is_refused_before_it():
    """One SECRET_KEY rule: what ``generate_secret_key`` prints passes ``check --deploy`` (W009), and
    a key that W009 would flag (49 characters) stops the settings before any check runs."""
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "REQUIRE_SECRET_KEY"}}
    env.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings")
    made = subprocess.run([sys.executable, "-m", "django", "generate_secret_key"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert len(key) >= 50 and len(set(key)) >= 5 and "\n" not in key
    proc = _check_deploy({**_production(), "SECRET_KEY": key})
    assert proc.returncode == 0 and "W009" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    short = _check_deploy({**_production(), "SECRET_KEY": key[:49]})
    assert short.returncode != 0 and "SECRET_KEY must be at least 50 characters" in short.stderr, short.stderr


def test_the_development_defaults_fail_check_deploy_naming_each_setting():
    proc = _check_deploy({})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for check in ("novelforge_sessions.W001", "security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in out, (check, out)


@pytest.mark.parametrize("missing", ["SECURE_HSTS_PRELOAD", "SECURE_SSL_REDIRECT", "CSRF_COOKIE_SECURE"])
def test_each_profile_setting_is_read_from_the_environment(missing):
    env = _production()
    env[missing] = "false"
    proc = _check_deploy(env)
    assert proc.returncode != 0 and missing in proc.stdout + proc.stderr


@pytest.mark.parametrize("name,value", [
    ("SECURE_SSL_REDIRECT", "maybe"),
    ("SECURE_HSTS_SECONDS", "a year"),
    ("SECURE_HSTS_SECONDS", "-1"),
    ("SESSION_COOKIE_SECURE", "sure"),
    ("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https"),
    ("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO"),
    ("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO,"),
])
def test_malformed_values_stop_start_up(name, value):
    proc = _check_deploy({**_production(), name: value})
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and name in proc.stderr, proc.stderr


def test_a_pool_no_larger_than_the_api_threads_stops_start_up():
    """Each lean API thread holds one pooled connection for its life: a pool of API_THREADS or
    fewer would leave pages and websockets waiting for a connection."""
    proc = _check_deploy({**_production(), "DB_POOL_MAX_SIZE": "4", "API_THREADS": "4"})
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and "DB_POOL_MAX_SIZE (4) must exceed API_THREADS (4)" in proc.stderr
    ok = _check_deploy({**_production(), "DB_POOL_MAX_SIZE": "5", "API_THREADS": "4"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # without the lean path nothing holds a connection past its request
    assert _check_deploy({**_production(), "DB_POOL_MAX_SIZE": "2", "API_LEAN": "false"}).returncode == 0


def test_the_proxy_header_is_parsed_into_djangos_pair():
    code = "from django.conf import settings; print(repr(settings.SECURE_PROXY_SSL_HEADER))"
    env = {k: v for k, v in os.environ.items() if k != "SECURE_PROXY_SSL_HEADER"}
    env.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
               SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('HTTP_X_FORWARDED_PROTO', 'https')"


@pytest.mark.parametrize("url_options, expected", [
    ("", "-c TimeZone=UTC -c plan_cache_mode=force_generic_plan"),
    # the URL's own options stand, and what they leave out is added
    ("?options=-c%20TimeZone%3DEurope%2FParis", "-c TimeZone=Europe/Paris -c plan_cache_mode=force_generic_plan"),
    ("?options=-c%20plan_cache_mode%3Dauto", "-c plan_cache_mode=auto -c TimeZone=UTC"),
])
def test_every_connection_starts_with_the_server_settings(url_options, expected):
    code = "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS']['options'])"
    env = dict(os.environ, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
               DATABASE_URL="postgres://postgres@127.0.0.1:5432/novelforge" + url_options)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected


# ------------------------------------------------------------------ HTTPS behind a proxy

PROXIED = dict(SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"),
               SECURE_HSTS_SECONDS=3600, SESSION_COOKIE_SECURE=True, CSRF_COOKIE_SECURE=True)


@pytest.mark.django_db
@override_settings(**PROXIED)
def test_probes_answer_over_plain_http_and_everything_else_is_redirected():
    client = Client()
    for probe in ("/healthz", "/readyz"):
        resp = client.get(probe)
        assert resp.status_code == 200, (probe, resp.status_code)
        assert "Strict-Transport-Security" not in resp
    for url in ("/login/", "/api/v1/sessions", "/healthz/extra"):
        resp = client.get(url)
        assert resp.status_code == 301 and resp["Location"] == "https://testserver" + url, url
    # Through the proxy (X-Forwarded-Proto: https) the page is served, with HSTS and secure cookies.
    resp = client.get("/login/", headers={"X-Forwarded-Proto": "https"})
    assert resp.status_code == 200
    assert resp["Strict-Transport-Security"] == "max-age=3600"
    assert resp.cookies["csrftoken"]["secure"] is True


# ------------------------------------------------------------------ Content-Security-Policy

def _policy(resp) -> dict[str, list[str]]:
    header = resp["Content-Security-Policy"]
    out: dict[str, list[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            out[words[0]] = words[1:]
    return out


def _pages(world: World) -> list[tuple[str, Client]]:
    gate = world.gate(reviewers=["alice"])
    manager, reviewer = Client(), Client()
    manager.force_login(world.users["mia"])
    reviewer.force_login(world.users["alice"])
    return [
        ("/login/", Client()),
        ("/", manager),
        (f"/sessions/{world.writer.id}/", manager),
        (f"/projects/{world.project.id}/", manager),
        ("/reviews/", reviewer),
        (f"/reviews/packets/{gate.packet.id}/", reviewer),
        ("/reviews/calibration/", manager),
        ("/api/docs", Client()),
    ]


@pytest.mark.django_db
def test_every_page_sends_a_strict_policy_with_a_fresh_nonce(project):
    world = make_world(project)
    for url, client in _pages(world):
        first, second = client.get(url), client.get(url)
        assert first.status_code == 200, (url, first.status_code)
        policy = _policy(first)
        nonce = [v for v in policy["script-src"] if v.startswith("'nonce-")]
        assert len(nonce) == 1, (url, policy)
        assert policy["script-src"] == ["'self'", nonce[0]], (url, policy["script-src"])
        assert policy["style-src"] == ["'self'", nonce[0]], (url, policy["style-src"])
        assert policy["default-src"] == ["'self'"] and policy["img-src"] == ["'self'", "data:"]
        assert policy["connect-src"] == ["'self'", "ws://testserver"], policy["connect-src"]
        assert policy["frame-ancestors"] == ["'none'"] and policy["object-src"] == ["'none'"]
        assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
        assert "'unsafe-inline'" not in first["Content-Security-Policy"], url
        assert "'unsafe-eval'" not in first["Content-Security-Policy"], url
        assert _policy(second)["script-src"] != policy["script-src"], f"{url}: the nonce is reused"

        html = first.content.decode()
        value = nonce[0].removeprefix("'nonce-").removesuffix("'")
        scripts = re.findall(r"<script\b[^>]*>", html)
        executable = [s for s in scripts if 'type="application/json"' not in s]
        assert bool(executable) == (url not in {"/login/", "/reviews/", "/reviews/calibration/"}), (url, executable)
        for tag in executable:
            assert 'src="/static/' in tag and f'nonce="{value}"' in tag, (url, tag)
        for tag in re.findall(r'<link\b[^>]*rel="stylesheet"[^>]*>', html):
            assert f'nonce="{value}"' in tag, (url, tag)
        # Nothing the policy would refuse: inline code, style attributes, event handlers.
        assert not re.search(r"<style\b", html), url
        assert not re.search(r"\sstyle=", html), url
        assert not re.search(r"\son[a-z]+\s*=", html), url
        assert "javascript:" not in html, url


@pytest.mark.django_db
def test_the_websocket_origin_follows_the_scheme(project):
    resp = Client().get("/login/", headers={"X-Forwarded-Proto": "https"}, HTTP_HOST="localhost")
    assert _policy(resp)["connect-src"] == ["'self'", "ws://localhost"]
    with override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")):
        resp = Client().get("/login/", headers={"X-Forwarded-Proto": "https"}, HTTP_HOST="localhost")
    assert _policy(resp)["connect-src"] == ["'self'", "wss://localhost"]


def test_no_template_carries_inline_script_style_or_event_handlers():
    """The policy refuses them; re-rendered panels and JSON-served fragments included."""
    offenders = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        text = path.read_text(encoding="utf-8")
        for pattern in (r"<script\b(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", r"<style\b", r"\sstyle=",
                        r"\son[a-z]+\s*=", r"javascript:"):
            for m in re.finditer(pattern, text):
                offenders.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
        for tag in re.findall(r"<script\b[^>]*\bsrc=[^>]*>", text):
            if "nonce=" not in tag:
                offenders.append(f"{path.relative_to(ROOT)}: script without the nonce: {tag}")
    assert offenders == []
