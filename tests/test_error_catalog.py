"""The error catalog is closed: every code is a class, every class is listed once in
``errors.CATALOG``, no raise site overrides a code, and the error table of docs/api.md is the catalog.

Also: the fingerprint pattern is written once (in the pure core) and everything else uses it.
"""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
from django.test import RequestFactory
from ninja.errors import HttpError

import novelforge_sessions
import reviews
from novelforge_sessions import errors
from novelforge_sessions import session_runtime as rt

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = (ROOT / "novelforge_sessions", ROOT / "reviews")


def _import_everything() -> None:
    for package in (novelforge_sessions, reviews):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def _sources() -> list[Path]:
    return [p for d in SOURCE_DIRS for p in sorted(d.rglob("*.py")) if "migrations" not in p.parts]


def test_every_concrete_error_class_anywhere_is_in_the_catalog():
    _import_everything()
    classes = {c for c in _subclasses(errors.ServiceError) if c.__module__.startswith(("novelforge_sessions", "reviews"))}
    concrete = {c for c in classes if not errors.is_abstract(c)}
    missing = sorted(f"{c.__module__}.{c.__qualname__} ({c.code})" for c in concrete - set(errors.CATALOG.values()))
    assert not missing, f"add these to errors._CATALOGUED: {missing}"
    # and every class is defined in the one module
    elsewhere = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if c.__module__ != errors.__name__)
    assert not elsewhere, f"define error classes in novelforge_sessions/errors.py: {elsewhere}"


def test_codes_are_unique_and_each_maps_to_its_class():
    concrete = [c for c in _subclasses(errors.ServiceError) if not errors.is_abstract(c)]
    codes = [c.code for c in concrete]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    for code, cls in errors.CATALOG.items():
        assert cls.code == code and isinstance(cls.http_status, int) and 400 <= cls.http_status < 600
        assert not errors.is_abstract(cls)
        err = cls("a message", field="x")
        assert err.as_dict() == {"error": {"code": code, "message": "a message", "details": {"field": "x"}}}


@pytest.mark.parametrize("keyword", ["code", "http_status"])
def test_a_raise_site_cannot_override_code_or_status(keyword):
    with pytest.raises(TypeError):
        errors.ValidationFailed("m", **{keyword: "other" if keyword == "code" else 418})


@pytest.mark.parametrize("cls", [errors.ServiceError, errors.Conflict, errors.BadRequest, errors.IntentNotExecutable])
def test_abstract_bases_cannot_be_raised_and_are_not_catalogued(cls):
    assert errors.is_abstract(cls) and cls not in errors.CATALOG.values()
    with pytest.raises(TypeError):
        cls("m")


def test_no_raise_site_passes_code_or_http_status():
    names = {c.__name__ for c in _subclasses(errors.ServiceError)} | {"ServiceError"}
    offending = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        raised = {id(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc is not None}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if func in names or id(node) in raised:
                for kw in node.keywords:
                    if kw.arg in ("code", "http_status"):
                        offending.append(f"{path.relative_to(ROOT)}:{node.lineno} {func}(…, {kw.arg}=…)")
    assert not offending, offending


def test_every_error_body_and_close_code_comes_from_the_catalog():
    """No module but the catalog builds an error body (``{"error": {"code": …}}``) or a refusal naming a
    catalogued code by hand, or closes a websocket with a literal code: they come from a catalogued
    class (``as_dict``, ``close_code``)."""
    offending = []
    for path in _sources():
        if path == ROOT / "novelforge_sessions" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "error" and isinstance(value, ast.Dict) \
                            and any(isinstance(k, ast.Constant) and k.value == "code" for k in value.keys):
                        offending.append(f"{path.relative_to(ROOT)}:{node.lineno} an error body by hand")
                    if isinstance(key, ast.Constant) and key.value == "code" and isinstance(value, ast.Constant) \
                            and value.value in errors.CATALOG:
                        offending.append(f"{path.relative_to(ROOT)}:{node.lineno} a refusal by hand ({value.value})")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "close":
                for kw in node.keywords:
                    if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                        offending.append(f"{path.relative_to(ROOT)}:{node.lineno} close(code={kw.value.value})")
    assert not offending, offending


@pytest.mark.parametrize(("code", "close_code"), [
    ("malformed_frame", 4400), ("unknown_type", 4400), ("already_authenticated", 4400),
    ("too_many_subscriptions", 4400), ("unauthorized", 4401), ("forbidden", 4403), ("payload_too_large", 4413),
])
def test_the_websocket_refusals_are_catalogued_with_their_close_codes(code, close_code):
    assert errors.CATALOG[code]("m").close_code == close_code


def _documented_error_table() -> dict[str, int]:
    text = (ROOT / "docs" / "api.md").read_text()
    match = re.search(r"^## Errors\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "docs/api.md has no '## Errors' section"
    lines = [ln for ln in match.group(1).splitlines() if ln.startswith("|")]
    assert lines[0].replace(" ", "") == "|code|HTTPstatus|meaning|", lines[0]
    rows: dict[str, int] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        code = cells[0].strip("`")
        assert code not in rows, f"docs/api.md lists {code} twice"
        assert cells[2], f"docs/api.md gives {code} no meaning"
        rows[code] = int(cells[1])
    return rows


def test_the_documented_error_table_is_the_catalog():
    documented = _documented_error_table()
    catalog = {code: cls.http_status for code, cls in errors.CATALOG.items()}
    assert sorted(set(documented) - set(catalog)) == [], "docs/api.md lists codes the catalog does not have"
    assert sorted(set(catalog) - set(documented)) == [], "catalogued codes missing from the error table of docs/api.md"
    assert documented == catalog


def test_the_api_keeps_its_codes_and_statuses():
    """Clients depend on these: the catalog may grow, but these never change."""
    kept = {
        "unauthorized": 401, "forbidden": 403, "not_found": 404, "illegal_transition": 409, "version_conflict": 409,
        "live_runtime_exists": 409, "no_live_runtime": 409, "runtime_not_live": 409, "open_run_exists": 409,
        "no_open_run": 409, "open_conflict": 409, "stale_authority": 409, "resume_refused": 409,
        "transcript_full": 409, "stale_lease": 409, "conflicting_result": 409, "review_route_required": 409,
        "stale_precondition": 409, "approval_required": 409, "stale_fingerprint": 409, "verdict_conflict": 409,
        "run_not_open": 409, "session_terminated": 409, "stale_runtime": 409, "runtime_required": 409,
        "independence_violation": 403, "payload_too_large": 413, "validation_error": 422,
        "checkpoint_not_bounded": 422, "malformed_body": 400, "method_not_allowed": 405, "internal_error": 500,
        "session_not_running": 409, "unknown_artifact_version": 422, "artifact_exists": 409, "intent_closed": 409,
        "not_approved": 409, "result_hash_mismatch": 422, "already_consumed": 409, "no_open_conflict": 409,
        "already_claimed": 409, "gate_closed": 409, "http_error": 400, "handoff_not_claimable": 409,
        "handoff_closed": 409, "logical_id_taken": 409, "invalid_result": 422, "idempotency_key_reused": 409,
        "postcondition_failed": 500,
    }
    assert {code: errors.CATALOG[code].http_status for code in kept} == kept
    # a subclass stays catchable as what its raise site used before
    assert issubclass(errors.UnknownArtifactVersion, errors.ValidationFailed)
    assert issubclass(errors.ResultHashMismatch, errors.ValidationFailed)
    assert issubclass(errors.IntentClosed, errors.IntentNotExecutable)


def test_pure_rule_errors_map_to_catalogued_classes():
    for exc, code in ((rt.IllegalTransition("no", allowed=["idle"]), "illegal_transition"),
                      (rt.CheckpointNotBounded("big", path="$"), "checkpoint_not_bounded"),
                      (rt.InvalidPayload("bad", field="f"), "validation_error")):
        err = errors.from_rule_error(exc)
        assert type(err) is errors.CATALOG[code] and err.details == exc.details


@pytest.mark.parametrize(("status", "code", "http_status"), [
    (400, "malformed_body", 400), (401, "unauthorized", 401), (403, "forbidden", 403), (404, "not_found", 404),
    (405, "method_not_allowed", 405), (413, "payload_too_large", 413), (422, "validation_error", 422),
    (418, "http_error", 400), (500, "internal_error", 500), (503, "internal_error", 500),
])
def test_ninja_http_errors_answer_a_catalogued_class(status, code, http_status):
    from novelforge_sessions.apikit.base import _http_error

    response = _http_error(RequestFactory().post("/api/v1/sessions"), HttpError(status, "refused"))
    assert response.status_code == http_status
    body = json.loads(response.content)
    assert body["error"]["code"] == code and code in errors.CATALOG


# ---- one fingerprint pattern -------------------------------------------------------------------

def test_the_fingerprint_pattern_is_written_once():
    literal = "[0-9a-f]{64}"
    holders = [p.relative_to(ROOT).as_posix() for p in _sources() if literal in p.read_text()]
    assert holders == ["novelforge_sessions/session_runtime.py"], holders
    assert rt.FINGERPRINT_RE.pattern == rt.FINGERPRINT_PATTERN


def test_every_fingerprint_check_constraint_uses_the_one_pattern():
    from django.apps import apps
    from django.db.models import CheckConstraint

    seen = 0
    for model in apps.get_models():
        for constraint in model._meta.constraints:
            if not isinstance(constraint, CheckConstraint):
                continue
            for child in constraint.condition.children:
                if isinstance(child, tuple) and child[0].endswith("__regex") and "sha256" in str(child[1]):
                    assert child[1] == rt.FINGERPRINT_PATTERN, (model, constraint.name)
                    seen += 1
    assert seen >= 9


def test_a_fingerprint_with_a_trailing_newline_is_not_a_fingerprint():
    """Python's ``$`` matches before a final newline; PostgreSQL's (same pattern) does not. The
    validators must agree with the database's check constraints."""
    good = "sha256:" + "a" * 64
    assert rt.is_fingerprint(good)
    for bad in (good + "\n", good.upper(), "sha256:" + "a" * 63, None, 7):
        assert not rt.is_fingerprint(bad)
    with pytest.raises(rt.InvalidPayload):
        rt.validate_fingerprint(good + "\n", "f")

    from reviews import verdicts

    assert verdicts.is_fingerprint is rt.is_fingerprint
