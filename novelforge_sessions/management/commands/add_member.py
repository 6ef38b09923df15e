"""Give a user a role in a project (the user is created when missing). Idempotent."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from novelforge_sessions.management.commands._accounts import (
    add_password_argument, check_users, ensure_membership, ensure_user, parse_passwords,
)
from novelforge_sessions.models import Membership, Project


class Command(BaseCommand):
    help = (
        "Add USER to the project SLUG as manager or reviewer. A missing user is created; its password "
        "comes from --password USER=SECRET or NOVELFORGE_PASSWORD_<USER>."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug", help="project slug")
        parser.add_argument("user", help="user name")
        parser.add_argument("--role", required=True, choices=[r.value for r in Membership.Role])
        add_password_argument(parser)

    def handle(self, *args, slug, user, role, password, **options):
        passwords = parse_passwords(password)
        with transaction.atomic():
            try:
                project = Project.objects.get(slug=slug)
            except Project.DoesNotExist:
                raise CommandError(f"no project with slug {slug!r} (create it with create_project)") from None
            new_passwords = check_users([user], passwords)
            account, made = ensure_user(user, new_passwords)
            if made:
                self.stdout.write(f"created user {user}")
            added = ensure_membership(account, project, Membership.Role(role))
        state = "is now" if added else "already is"
        self.stdout.write(self.style.SUCCESS(f"{user} {state} {role} of {slug}"))
