from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Independent review"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Review gates are one of the things a run waits on: checkpoints resolve `pending.gates`,
        # resume revalidates them (step "reviews") and carries them over to the new run.
        from novelforge_sessions.control.service import register_wait_kind
        from reviews.waits import REVIEW_GATES

        register_wait_kind(REVIEW_GATES)
