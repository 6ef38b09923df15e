"""Create a project with its managers and reviewers, without the admin. Idempotent: a second run with
the same arguments changes nothing (existing users keep their passwords)."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from novelforge_sessions.management.commands._accounts import (
    add_password_argument, check_users, ensure_membership, ensure_user, parse_passwords,
)
from novelforge_sessions.models import Membership, Project


class Command(BaseCommand):
    help = (
        "Create a project (by slug) and its members: --manager USER and --reviewer USER (repeatable). "
        "Missing users are created; a new user's password comes from --password USER=SECRET or "
        "NOVELFORGE_PASSWORD_<USER>."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the project's slug (its id in URLs and tokens)")
        parser.add_argument("--name", help="display name (default: the slug; an existing project is renamed)")
        parser.add_argument("--manager", action="append", default=[], metavar="USER", help="repeatable")
        parser.add_argument("--reviewer", action="append", default=[], metavar="USER", help="repeatable")
        parser.add_argument("--lock-fingerprint", default=None, help="the project's authority lock fingerprint")
        parser.add_argument("--framework-version", default=None)
        add_password_argument(parser)

    def handle(self, *args, slug, name, manager, reviewer, lock_fingerprint, framework_version, password, **options):
        field = Project._meta.get_field("slug")
        try:
            field.clean(slug, None)
        except Exception as exc:  # ValidationError: not a slug, too long
            raise CommandError(f"invalid slug {slug!r}: {' '.join(getattr(exc, 'messages', [str(exc)]))}") from None
        passwords = parse_passwords(password)
        with transaction.atomic():
            new_passwords = check_users(manager + reviewer, passwords)
            defaults = {"name": name or slug}
            if lock_fingerprint is not None:
                defaults["lock_fingerprint"] = lock_fingerprint
            if framework_version is not None:
                defaults["framework_version"] = framework_version
            project, created = Project.objects.get_or_create(slug=slug, defaults=defaults)
            if not created:
                changed = {k: v for k, v in defaults.items() if (k != "name" or name) and getattr(project, k) != v}
                if changed:
                    for key, value in changed.items():
                        setattr(project, key, value)
                    project.save(update_fields=list(changed))
                    self.stdout.write(f"updated {', '.join(sorted(changed))} of project {slug}")
            for role, usernames in ((Membership.Role.MANAGER, manager), (Membership.Role.REVIEWER, reviewer)):
                for username in usernames:
                    user, made = ensure_user(username, new_passwords)
                    if made:
                        self.stdout.write(f"created user {username}")
                    if ensure_membership(user, project, role):
                        self.stdout.write(f"{username} is now {role.label.lower()} of {slug}")
        self.stdout.write(self.style.SUCCESS(f"project {slug} {'created' if created else 'exists'}"))
