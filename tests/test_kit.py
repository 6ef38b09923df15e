"""The test kit (tests/support) fails when it should: a helper that cannot fail would make every
test that leans on it pass without proving anything."""
from __future__ import annotations

import json
import time

import pytest

from novelforge_sessions.errors import HandoffNotClaimable
from novelforge_sessions.models import Project
from tests.support.factories import make_project
from tests.support.races import oks, race
from tests.support.responses import check_error, refused
from tests.support.snapshots import snapshot
from tests.support.waits import wait_until


class Answer:
    """Just enough of a test client's response for ``refused``."""

    def __init__(self, status: int, body: dict) -> None:
        self.status_code = status
        self.content = json.dumps(body).encode()

    def json(self) -> dict:
        return json.loads(self.content)


def error(code: str = "validation_error", **details) -> dict:
    return {"error": {"code": code, "message": "bad input", "details": details}}


@pytest.mark.django_db
def test_a_snapshot_sees_any_changed_column_and_names_the_table():
    project = make_project("kit")
    before = snapshot()
    before.assert_unchanged()
    Project.objects.filter(id=project.id).update(name="Renamed")
    assert snapshot() != before
    with pytest.raises(AssertionError, match="novelforge_sessions.Project"):
        before.assert_unchanged()
    # narrowed: a table left out, or a column ignored, no longer counts
    snapshot(exclude=["Project"]).assert_unchanged()
    narrowed = snapshot(ignore={"Project": ["name"]})
    Project.objects.filter(id=project.id).update(name="Again")
    narrowed.assert_unchanged()


@pytest.mark.django_db
def test_refused_checks_status_shape_code_details_and_that_nothing_was_written():
    assert refused(Answer(422, error(field="x")), 422, "validation_error", "x")["details"] == {"field": "x"}
    refused(Answer(409, error("conflict", a=1, b=2)), 409, "conflict", details={"a": 1, "b": 2})
    refused(Answer(409, error("conflict", a=1, b=2)), 409, "conflict", details_has={"a": 1}, message="bad")
    failing = [
        lambda: refused(Answer(400, error()), 422, "validation_error"),  # status
        lambda: refused(Answer(422, error()), 422, "other_code"),  # code
        lambda: refused(Answer(422, error(field="y")), 422, "validation_error", "x"),  # field
        lambda: refused(Answer(409, error("c", a=1, b=2)), 409, "c", details={"a": 1}),  # whole details
        lambda: refused(Answer(422, {**error(), "extra": 1}), 422, "validation_error"),  # beside "error"
        lambda: check_error({**error()["error"], "hint": "x"}, "validation_error"),  # not the one shape
        lambda: check_error({**error()["error"], "message": ""}, "validation_error"),  # no message
    ]
    for check in failing:
        with pytest.raises(AssertionError):
            check()
    before = snapshot()
    make_project("written")
    with pytest.raises(AssertionError, match="wrote nothing"):
        refused(Answer(422, error()), 422, "validation_error", unchanged=before)


def test_race_returns_every_outcome_in_thread_order():
    def work(i: int) -> int:
        if i == 1:
            raise HandoffNotClaimable("no")
        if i == 2:
            raise ValueError("a bug")
        return i * 10

    results = race(work, 4)
    assert results[0] == ("ok", 0) and results[3] == ("ok", 30)
    assert results[1] == ("error", HandoffNotClaimable.code)
    assert results[2][0] == "crash" and "a bug" in results[2][1]
    with pytest.raises(AssertionError):
        oks(results)
    assert oks(race([lambda: "a", lambda: "b"])) == ["a", "b"]


def test_wait_until_returns_the_value_and_fails_naming_what_it_waited_for():
    started = time.monotonic()
    assert wait_until(lambda: time.monotonic() - started > 0.05 and "done", "a moment") == "done"
    with pytest.raises(AssertionError, match="the impossible"):
        wait_until(lambda: False, "the impossible", timeout=0.1)
    with pytest.raises(RuntimeError, match="it died"):
        wait_until(lambda: False, "a process", timeout=30, fail=lambda: "it died", error=RuntimeError)
    tries = iter([OSError(), OSError(), "up"])

    def flaky() -> str:
        value = next(tries)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(flaky, "a port", ignore=(OSError,), interval=0.01) == "up"
