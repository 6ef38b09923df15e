from django.apps import AppConfig


class NovelforgeSessionsConfig(AppConfig):
    name = "novelforge_sessions"
    verbose_name = "Session runtime"
    default_auto_field = "django.db.models.BigAutoField"
