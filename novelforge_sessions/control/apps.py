from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "novelforge_sessions.control"
    label = "control"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Session actions (a layer below) ask the wait registry what holds a run through this
        # hook, without importing the control plane (actions.lifecycle.holds).
        # The same for withdrawing what a session waits on when it can take no more work
        # (→ terminated / stale: actions.lifecycle.withdraw_waits).
        from novelforge_sessions.actions.lifecycle import install_holds_query, install_withdraw_waits
        from novelforge_sessions.control.waits import holding, withdraw

        install_holds_query(holding)
        install_withdraw_waits(withdraw)
