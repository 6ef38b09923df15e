from django.apps import AppConfig


class NovelforgeSessionsConfig(AppConfig):
    name = "novelforge_sessions"
    verbose_name = "Session runtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from novelforge_sessions import checks  # noqa: F401  registers the system checks

        if settings.FAULT_POINTS:  # the harness's test-only hook (faults.py); empty unless set
            from novelforge_sessions import faults

            faults.install(settings.FAULT_POINTS)
