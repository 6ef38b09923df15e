"""Load a small demo project. Idempotent: a second run changes nothing and prints the same token."""
import hashlib
import hmac
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from novelforge_sessions.access import Caller
from novelforge_sessions.session_runtime import RunState, SessionStatus
from novelforge_sessions.actions import artifacts, runs, runtimes, sessions
from novelforge_sessions.control import checkpoints
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.models import ApiToken, Membership, Project

DEMO_SLUG = "demo-novel"
DEMO_USERS = {"manager": "manager-demo-pass", "reviewer": "reviewer-demo-pass"}


def _reachable(base_url: str) -> str:
    """The URL a client on this machine uses: a server bound to every address (``0.0.0.0``, ``::``)
    is reached on the loopback address."""
    base_url = base_url.rstrip("/")
    for wildcard in ("//0.0.0.0:", "//[::]:", "//:::"):
        base_url = base_url.replace(wildcard, "//127.0.0.1:")
    return base_url


def demo_token() -> str:
    """Deterministic per SECRET_KEY, so re-running prints the same token; only its hash is stored."""
    return "nfs_demo_" + hmac.new(settings.SECRET_KEY.encode(), b"demo-token", hashlib.sha256).hexdigest()[:40]


class Command(BaseCommand):
    help = "Create the demo project, users, token and a few sessions in different states."

    def add_arguments(self, parser):
        parser.add_argument(
            "--base-url", default="http://127.0.0.1:8000",
            help="where the server listens, for the printed curl line (`make run` passes RUN_HOST/RUN_PORT)",
        )

    def handle(self, *args, base_url="http://127.0.0.1:8000", **options):
        raw = demo_token()
        with transaction.atomic():
            project, created = Project.objects.get_or_create(
                slug=DEMO_SLUG,
                defaults={"name": "The Lighthouse Keeper (demo)", "lock_fingerprint": "sha256:" + "0" * 64,
                          "framework_version": "2"},
            )
            User = get_user_model()
            for username, password in DEMO_USERS.items():
                user, made = User.objects.get_or_create(username=username)
                if made:
                    user.set_password(password)
                    user.save()
                role = Membership.Role.MANAGER if username == "manager" else Membership.Role.REVIEWER
                Membership.objects.get_or_create(user=user, project=project, role=role)
            if not User.objects.filter(username="admin").exists():
                User.objects.create_superuser("admin", "admin@example.invalid", "admin-demo-pass")
            ApiToken.objects.get_or_create(
                key_hash=ApiToken.hash_key(raw),
                defaults={"name": "demo", "project": project, "key_prefix": raw[:12],
                          "permissions": [p.value for p in ApiToken.Permission]},
            )
        if created:
            self._populate(project)
        self.stdout.write(self.style.SUCCESS("Demo project ready: " + DEMO_SLUG))
        self.stdout.write(f"  API token (all permissions): {raw}")
        self.stdout.write("  Dashboard login: manager / manager-demo-pass  (reviewer / reviewer-demo-pass)")
        self.stdout.write("  Admin login:     admin / admin-demo-pass")
        self.stdout.write(f'  Try: curl -H "Authorization: Bearer {raw}" {_reachable(base_url)}/api/v1/sessions')

    def _populate(self, project: Project) -> None:
        who = Caller(label="demo-loader", project_ids=frozenset({project.id}),
                     permissions=frozenset({"read", "write"}), project=project)
        chapter = artifacts.create_artifact(
            who, name="chapter-01-draft", kind="chapter",
            content="The lamp had not failed in forty years. Tonight it flickered twice, and Mara counted.\n",
        )
        plan = artifacts.create_artifact(who, name="book-plan", kind="plan", content="1. The lamp.\n2. The storm.\n3. The ship.\n")
        refs = [{"artifact_id": a.id, "fingerprint": a.current_version.fingerprint} for a in (chapter, plan)]

        def live(role: str, task: str, family: str, caps: list[str]) -> int:
            s = sessions.create_session(
                who, sessions.NewSession(role=role, memory_policy="bounded" if role != "manager" else "session",
                                         task_mode=task, runtime_family=family,
                                         provider_metadata={"thread_id": f"demo-{role}-{task}"}),
                runtime=RuntimeSpec(runtime_family=family, capabilities=caps, lease_seconds=3600),
            )
            return s.id

        # A manager session running its planning run, with a checkpoint.
        manager = live("manager", "planning", "chat", ["plan", "route"])
        run = runs.start_run(who, manager, cursor={"step": "outline"})
        checkpoints.record_checkpoint(who, run.id, {"boundary": "context_freeze", "cursor": {"step": "outline"}, "artifacts": refs})
        append_transcript(who, manager, role="user", content="Plan chapter two around the storm.")
        # A writer that finished a run and is idle.
        writer = live("writer", "drafting", "claude-code", ["draft"])
        run = runs.start_run(who, writer, cursor={"step": "draft", "chapter": 1})
        checkpoints.record_checkpoint(who, run.id, {"boundary": "candidate_frozen", "cursor": {"step": "draft-done"}, "artifacts": refs[:1]})
        runs.end_run(who, run.id, outcome=RunState.COMPLETED)
        # A specialist waiting on the user.
        specialist = live("specialist", "research", "codex", ["research"])
        run = runs.start_run(who, specialist, cursor={"step": "ask-user"})
        checkpoints.record_checkpoint(who, run.id, {"boundary": "user_wait", "cursor": {"step": "ask-user"}})
        sessions.transition_session(who, specialist, SessionStatus.AWAITING_USER, reason="needs the era of the lighthouse")
        # A writer whose runtime died mid-run: the reconciler makes it failed / runtime_lost (resumable).
        lost = sessions.create_session(
            who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="revision", runtime_family="local-model"),
            runtime=RuntimeSpec(runtime_family="local-model", capabilities=["draft"], lease_seconds=1),
        ).id
        run = runs.start_run(who, lost, cursor={"step": "revise", "pass": 2})
        checkpoints.record_checkpoint(who, run.id, {"boundary": "before_long_handoff", "cursor": {"step": "revise", "pass": 2}})
        runtimes.reconcile_expired_runtimes(now=timezone.now() + timedelta(seconds=5))
        # A finished session and a fresh one.
        done = live("specialist", "continuity-check", "ci", ["check"])
        run = runs.start_run(who, done, cursor={"step": "check"})
        runs.end_run(who, run.id, outcome=RunState.COMPLETED, session_status=SessionStatus.COMPLETED)
        sessions.create_session(who, sessions.NewSession(role="other", role_extension="illustrator", memory_policy="none",
                                                         task_mode="cover-art", runtime_family="mcp-worker"))
        self._populate_control_and_review(project, who, chapter, plan)

    def _populate_control_and_review(self, project: Project, who: Caller, chapter, plan) -> None:
        """A writer waiting on an external job, a draft waiting for review, a write awaiting approval."""
        from novelforge_sessions.control import handoffs, intents
        from reviews import actions as reviews

        ref = {"artifact_id": chapter.id, "fingerprint": chapter.current_version.fingerprint}
        # A writer that handed a continuity check to an external worker (awaiting_external).
        waiting = sessions.create_session(
            who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="continuity", runtime_family="codex"),
            runtime=RuntimeSpec(runtime_family="codex", capabilities=["draft"], lease_seconds=3600),
        ).id
        run = runs.start_run(who, waiting, cursor={"step": "continuity-check"})
        # The job is frozen first: a checkpoint's pending refs must name handoffs that exist.
        handoffs.create_handoff(who, run.id, logical_id="continuity-ch1", inputs=[ref],
                                required_capabilities=["continuity"], timeout_seconds=600)
        checkpoints.record_checkpoint(who, run.id, {"boundary": "before_long_handoff", "cursor": {"step": "continuity-check"},
                                                    "artifacts": [ref], "pending": {"handoffs": ["continuity-ch1"]}})
        # A second draft of chapter one, frozen for a blind review by the demo reviewer (awaiting_user).
        draft = artifacts.add_artifact_version(
            who, chapter.id,
            content=chapter.current_version.content + "She wrote the count in the logbook, and the logbook wrote back.\n",
        )
        writer = sessions.create_session(
            who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="claude-code"),
            runtime=RuntimeSpec(runtime_family="claude-code", capabilities=["draft"], lease_seconds=3600),
        ).id
        run = runs.start_run(who, writer, cursor={"step": "review-draft-2"})
        reviews.open_gate(who, writer, reviews.GateSpec(
            candidate_version_id=draft.id, route="page", reviewers=["reviewer"],
            rubric={"criteria": [
                {"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5},
                 "description": "Can a reader follow every sentence?"},
                {"key": "voice", "label": "Voice", "scale": {"min": 1, "max": 5},
                 "description": "Does the narrating voice hold steady from the first line to the last?"},
            ]},
        ))
        # Making draft 2 current is a consequential write: it waits for a manager's approval.
        before = intents.read_before_state(who, kind="artifact.make_current", artifact_id=chapter.id)
        intents.create_intent(who, kind="artifact.make_current", idempotency_key="demo-promote-ch1-v2",
                              before_fingerprint=before.fingerprint, params={"version_id": draft.id},
                              artifact_id=chapter.id, session_id=writer)
