"""Users and memberships for the project commands (``create_project``, ``add_member``).

A user named on the command line is created when missing; a new user needs a password, given as
``--password USER=SECRET`` or in the environment as ``NOVELFORGE_PASSWORD_<USER>`` (the name upper-cased,
every character other than a letter or digit as ``_``). An existing user keeps the password it has.
"""
from __future__ import annotations

import os
import re

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from novelforge_sessions.models import Membership, Project


def password_env_name(username: str) -> str:
    return "NOVELFORGE_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", username).upper()


def add_password_argument(parser) -> None:
    parser.add_argument(
        "--password", action="append", default=[], metavar="USER=SECRET",
        help="password of a user created by this command (repeatable); "
             "or set NOVELFORGE_PASSWORD_<USER> in the environment",
    )


def parse_passwords(pairs: list[str]) -> dict[str, str]:
    passwords = {}
    for pair in pairs:
        user, sep, secret = pair.partition("=")
        if not sep or not user or not secret:
            raise CommandError(f"--password takes USER=SECRET, got {pair!r}")
        passwords[user] = secret
    return passwords


def check_users(usernames: list[str], passwords: dict[str, str]) -> dict[str, str]:
    """Before anything is written: the password of every user that does not exist yet (validated)."""
    User = get_user_model()
    existing = set(User.objects.filter(username__in=usernames).values_list("username", flat=True))
    needed = {}
    for username in dict.fromkeys(usernames):
        if username in existing:
            continue
        try:
            User.username_validator(username)
        except ValidationError as exc:
            raise CommandError(f"invalid user name {username!r}: {' '.join(exc.messages)}") from None
        secret = passwords.get(username) or os.environ.get(password_env_name(username), "")
        if not secret:
            raise CommandError(
                f"user {username!r} does not exist: give its password with --password {username}=… "
                f"or {password_env_name(username)}=…"
            )
        try:
            validate_password(secret, user=User(username=username))
        except ValidationError as exc:
            raise CommandError(f"password of {username!r}: {' '.join(exc.messages)}") from None
        needed[username] = secret
    return needed


def ensure_user(username: str, new_passwords: dict[str, str]) -> tuple[object, bool]:
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    if created:
        user.set_password(new_passwords[username])
        user.save(update_fields=["password"])
    return user, created


def ensure_membership(user, project: Project, role: str) -> bool:
    _, created = Membership.objects.get_or_create(user=user, project=project, role=role)
    return created
