from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "novelforge_sessions.control"
    label = "control"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"
