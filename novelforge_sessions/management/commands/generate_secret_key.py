"""``python -m django generate_secret_key``: print a new random SECRET_KEY for a deployment.

It meets the one rule the settings enforce and ``check --deploy`` checks (security.W009: at
least 50 characters, at least 5 different ones): Django's own ``get_random_secret_key``.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand
from django.core.management.utils import get_random_secret_key


class Command(BaseCommand):
    help = "Print a new random SECRET_KEY (50 characters) for a deployment's environment."
    requires_system_checks: list[str] = []

    def handle(self, *args, **options):
        self.stdout.write(get_random_secret_key())
