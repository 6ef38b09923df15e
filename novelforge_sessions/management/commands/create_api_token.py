from django.core.management.base import BaseCommand, CommandError

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.errors import ServiceError
from novelforge_sessions.models import Project, Session


class Command(BaseCommand):
    help = "Create an API token for a project and print it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug")
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--permissions", default="read,write", help=f"comma-separated, from: {','.join(ALL_PERMISSIONS)}"
        )
        parser.add_argument(
            "--session", type=int, default=None,
            help="bind the token to one session id: it reaches only what that session owns or was given "
            "(add the 'project' permission to reach the project's artifacts, intents and authority history)",
        )

    def handle(self, *args, project, name, permissions, session, **options):
        try:
            proj = Project.objects.get(slug=project)
        except Project.DoesNotExist:
            raise CommandError(f"no project with slug {project!r}") from None
        bound = None
        if session is not None:
            bound = Session.objects.filter(id=session, project=proj).first()
            if bound is None:
                raise CommandError(f"session {session} is not in project {project}")
        try:
            _, raw = create_token(proj, name=name, permissions=[p.strip() for p in permissions.split(",") if p.strip()], session=bound)
        except ServiceError as exc:
            raise CommandError(f"{exc.code}: {exc.message} {exc.details}") from None
        self.stdout.write(raw)
