from django.apps import AppConfig


class NovelforgeSessionsConfig(AppConfig):
    name = "novelforge_sessions"
    verbose_name = "Session runtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from novelforge_sessions import checks  # noqa: F401  registers the system checks
