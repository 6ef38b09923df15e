from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Independent review"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Review gates are one of the things a run waits on: checkpoints resolve `pending.gates`,
        # resume revalidates them (step "reviews") and carries them over to the new run.
        # A session that takes no more work (terminated, stale) withdraws its pending gates
        # through the cancel action (reviews.waits sits below reviews.actions, hence the wiring here).
        from dataclasses import replace

        from novelforge_sessions.control.service import register_wait_kind
        from reviews.actions import withdraw_gates
        from reviews.waits import REVIEW_GATES

        register_wait_kind(replace(REVIEW_GATES, withdraw=withdraw_gates))
