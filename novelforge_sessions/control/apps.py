from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "novelforge_sessions.control"
    label = "control"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Session actions (a layer below) ask the wait registry what holds a run through this
        # hook, without importing the control plane (actions.lifecycle.holds).
        from novelforge_sessions.actions.lifecycle import install_holds_query
        from novelforge_sessions.control.waits import holding

        install_holds_query(holding)
