"""Health probes, strict settings, the demo loader, and provider ids as metadata only."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.test import Client

from novelforge_sessions.management.commands.load_demo import DEMO_SLUG, demo_token
from novelforge_sessions.models import ApiToken, Project, Session

from tests.support.factories import SESSION, Api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.django_db
def test_health_and_readiness():
    assert Client().get("/healthz").json() == {"status": "ok"}
    assert Client().get("/readyz").json() == {"status": "ok", "database": "ok"}


def _settings_with(**env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", "import django; from django.conf import settings; django.setup(); print('ok')"],
        cwd=ROOT, env=full, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "maybe"}, "DEBUG must be a boolean"),
        ({"DATABASE_URL": "sqlite:///x.db"}, "must point at PostgreSQL"),
        ({"REDIS_URL": "http://nope"}, "REDIS_URL must be a redis:// URL"),
        ({"SECRET_KEY": "short"}, "SECRET_KEY must be at least 50"),
        ({"SECRET_KEY": "k" * 40 + "0123456789"[:8]}, "SECRET_KEY must be at least 50"),  # 48: the old rule took it
        ({"SECRET_KEY": "ab" * 30}, "at least 5 different characters"),
        ({"CHECKPOINT_MAX_BYTES": "lots"}, "CHECKPOINT_MAX_BYTES must be an integer"),
    ],
)
def test_bad_settings_fail_loudly(env, message):
    result = _settings_with(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_good_settings_load():
    result = _settings_with(DEBUG="false", ALLOWED_HOSTS="example.org,localhost")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_a_value_starting_with_a_dollar_sign_is_taken_as_written():
    """django-environ alone reads ``$NAME`` as another variable's name: a generated SECRET_KEY that
    starts with ``$`` (one in 50) was replaced by the development default, so REQUIRE_SECRET_KEY
    refused it as unset. Each value is taken as written, whatever variable its tail names."""
    key = "$HOME" + "x7#k!q(2)-z_=+9" * 4
    code = ("import django; from django.conf import settings; django.setup(); "
            "print(settings.SECRET_KEY); print(settings.METRICS_TOKEN); print(settings.ALLOWED_HOSTS)")
    full = {**os.environ, "SECRET_KEY": key, "REQUIRE_SECRET_KEY": "true", "DEBUG": "false",
            "METRICS_TOKEN": "$PATH-and-sixteen-more", "ALLOWED_HOSTS": "$HOME,example.org"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [key, "$PATH-and-sixteen-more", "['$HOME', 'example.org']"]


def _served_process_says(probe: str) -> list[str]:
    """The lines ``probe`` prints, run in a fresh interpreter (as a server process starts)."""
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=dict(os.environ),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_served_application_is_built_then_frozen_out_of_the_collectors_reach():
    """``novelforge_sessions.asgi`` ends with ``gc.freeze()``: a full collection in a server then
    scans what requests allocate, not the start-up heap."""
    probe = (
        "import gc; before = gc.get_freeze_count(); default = gc.get_threshold(); import novelforge_sessions.asgi; "
        "print(before, gc.get_freeze_count(), len(gc.get_objects())); print(default, gc.get_threshold())"
    )
    counts, thresholds = _served_process_says(probe)
    before, frozen, tracked = map(int, counts.split())
    assert before == 0
    assert frozen > 50_000  # Django, the apps, channels and the URLconf
    assert tracked < frozen / 5  # what the collector still scans: next to nothing
    # And the collector's young generation is made larger than Python's default for a server's
    # many connections (asgi.GC_THRESHOLDS): a full collection comes far less often.
    default, served = (tuple(int(n) for n in part.strip("()").split(",")) for part in thresholds.split(") ("))
    assert default == (700, 10, 10) and served == (10_000, 10, 10)


def test_the_urlconf_and_the_api_socket_routes_are_built_before_the_freeze_not_by_the_first_request():
    """The first request found the URLconf (every API route and its schemas) still to import, about
    half a second, and what it built then lived outside the freeze. Built with the application:
    resolving an API path afterwards imports nothing, and the routes are frozen with the rest."""
    probe = (
        "import gc, sys; import novelforge_sessions.asgi; from django.conf import settings; "
        "from django.urls import resolve; from novelforge_sessions.api import socket; "
        "urls = sys.modules.get(settings.ROOT_URLCONF); loaded = set(sys.modules); "
        "built = socket.fast_routes.cache_info().currsize; "
        "tracked = {id(o) for o in gc.get_objects()}; "
        "print(urls is not None, built, id(urls.urlpatterns) in tracked, id(socket.fast_routes()) in tracked); "
        "resolve('/api/v1/runs/1/checkpoints'); print(sorted(set(sys.modules) - loaded))"
    )
    imported, new_modules = _served_process_says(probe)
    assert imported == "True 1 False False"  # imported, built, and neither left to the collector
    assert new_modules == "[]"


@pytest.mark.django_db
def test_demo_loader_is_idempotent_and_its_token_lists_sessions(capsys):
    call_command("load_demo")
    first = capsys.readouterr().out
    counts = (Project.objects.count(), Session.objects.count(), ApiToken.objects.count())
    call_command("load_demo")
    second = capsys.readouterr().out
    assert (Project.objects.count(), Session.objects.count(), ApiToken.objects.count()) == counts
    assert demo_token() in first and demo_token() in second
    statuses = set(Session.objects.filter(project__slug=DEMO_SLUG).values_list("status", flat=True))
    assert {"running", "idle", "awaiting_user", "awaiting_external", "failed", "completed", "created"} <= statuses
    from novelforge_sessions.control.models import Handoff, WriteIntent
    from reviews.models import ReviewGate

    assert Handoff.objects.filter(project__slug=DEMO_SLUG, state="pending").count() == 1
    assert WriteIntent.objects.filter(project__slug=DEMO_SLUG, state="proposed").count() == 1
    assert ReviewGate.objects.filter(session__project__slug=DEMO_SLUG, state="pending").count() == 1
    listed = Api(demo_token()).get("/sessions").json()["items"]
    assert len(listed) == Session.objects.filter(project__slug=DEMO_SLUG).count() >= 6


@pytest.mark.django_db
def test_provider_ids_are_stored_but_never_keys(owner):
    """Two sessions may carry the same provider thread id; it identifies nothing and grants nothing."""
    meta = {"thread_id": "thr_123", "conversation_id": "conv_9", "role": "admin"}
    a = owner.post("/sessions", {**SESSION, "provider_metadata": meta}).json()
    b = owner.post("/sessions", {**SESSION, "provider_metadata": meta}).json()
    assert a["id"] != b["id"] and a["provider_metadata"] == b["provider_metadata"] == meta
    # Not addressable by provider id, and never unique on it.
    assert owner.get("/sessions/thr_123").status_code == 422
    assert owner.get("/sessions", thread_id="thr_123").json()["items"][0]["id"] == a["id"]  # ignored filter
    unique_fields = {f.name for f in Session._meta.fields if f.unique}
    assert unique_fields == {"id"}
    constrained = {tuple(c.fields) for c in Session._meta.constraints if getattr(c, "fields", None)}
    assert not any("provider_metadata" in fields for fields in constrained)
