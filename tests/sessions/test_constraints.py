"""The database itself enforces the invariants (not only the actions)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from novelforge_sessions.models import Checkpoint, Run, RuntimeAttachment, Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(project) -> Session:
    return Session.objects.create(project=project, role="writer", memory_policy="bounded", task_mode="t", runtime_family="f")


def attachment(session: Session, generation: int, state: str = "live") -> RuntimeAttachment:
    now = timezone.now()
    return RuntimeAttachment.objects.create(
        session=session, generation=generation, runtime_family="f", state=state, lease_seconds=60,
        lease_expires_at=now + timedelta(seconds=60), heartbeat_at=now,
    )


def violates_constraint(fn) -> bool:
    try:
        with transaction.atomic():
            fn()
    except IntegrityError:
        return True
    return False


def test_at_most_one_live_runtime_per_session(session):
    attachment(session, 1)
    assert violates_constraint(lambda: attachment(session, 2))
    attachment(session, 3, state="closed")  # ended generations are unlimited
    assert violates_constraint(lambda: attachment(session, 3, state="closed")), "generation numbers are unique"


def test_at_most_one_open_run_and_unique_sequences(session):
    Run.objects.create(session=session, seq=1, generation=1, task_mode="t")
    assert violates_constraint(lambda: Run.objects.create(session=session, seq=2, generation=1, task_mode="t"))
    Run.objects.filter(session=session).update(state="completed")
    run = Run.objects.create(session=session, seq=2, generation=1, task_mode="t")
    assert violates_constraint(
        lambda: Run.objects.create(session=session, seq=2, generation=1, task_mode="t", state="failed"))
    Checkpoint.objects.create(session=session, run=run, seq=1, boundary="user_wait", cursor={"a": 1}, size_bytes=1)
    assert violates_constraint(
        lambda: Checkpoint.objects.create(session=session, run=run, seq=1, boundary="user_wait", cursor={}, size_bytes=1))


@pytest.mark.parametrize(
    ("field", "value"),
    [("status", "paused"), ("role", "boss"), ("memory_policy", "forever")],
)
def test_enums_are_checked_by_the_database(session, field, value):
    assert violates_constraint(lambda: Session.objects.filter(id=session.id).update(**{field: value}))


def test_role_extension_only_with_other(session):
    assert violates_constraint(lambda: Session.objects.filter(id=session.id).update(role_extension="x"))
    assert violates_constraint(lambda: Session.objects.filter(id=session.id).update(role="other"))
    Session.objects.filter(id=session.id).update(role="other", role_extension="illustrator")


def test_checkpoint_boundary_and_run_state_enums(session):
    run = Run.objects.create(session=session, seq=1, generation=1, task_mode="t")
    assert violates_constraint(lambda: Run.objects.filter(id=run.id).update(state="paused"))
    assert violates_constraint(
        lambda: Checkpoint.objects.create(session=session, run=run, seq=1, boundary="whenever", cursor={}, size_bytes=1))
