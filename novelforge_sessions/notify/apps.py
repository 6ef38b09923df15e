from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "novelforge_sessions.notify"
    label = "notify"
    verbose_name = "Email notifications"
    default_auto_field = "django.db.models.BigAutoField"
