"""Run in a subprocess against the throwaway cluster: ``[--migrate] NAME…`` migrates (once), then
creates one project (slug NAME) and one token per name.

Prints one JSON line: ``{NAME: {"token", "project_id", "tables": {...}}}`` (the table names the
checks read, from the models, so no name is guessed).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    names = sys.argv[1:]
    if names[:1] == ["--migrate"]:
        call_command("migrate", verbosity=0, interactive=False)
        names = names[1:]
    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
    from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery
    from novelforge_sessions.models import Checkpoint, Event, Project, Run, Session

    tables = {m.__name__: m._meta.db_table for m in (ConsumeReceipt, Handoff, ResultDelivery, Checkpoint, Event, Run, Session)}
    out = {}
    for name in names:
        slug = name.replace("_", "-")
        project = Project.objects.create(slug=slug, name=slug.title(), lock_fingerprint="sha256:" + "a" * 64,
                                         framework_version="1")
        _, token = create_token(project, name="harness", permissions=ALL_PERMISSIONS)
        out[name] = {"token": token, "project_id": project.id, "tables": tables}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
