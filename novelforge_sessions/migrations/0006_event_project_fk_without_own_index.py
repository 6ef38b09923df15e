"""Event.project loses its own single-column index.

``event_project_id`` (project, id) already serves every lookup by project, the FK's cascade
included, so the FK's own index only cost every event insert one more index entry. Django's
AlterField would drop and re-add the foreign key constraint around the index (re-validating
it: a full scan of the event table under lock), so the database side is only the index.
"""
import django.db.models.deletion
from django.db import migrations, models

INDEX = "novelforge_sessions_event_project_id_b968dc37"


class Migration(migrations.Migration):

    dependencies = [
        ("novelforge_sessions", "0005_event_watermark_signed_xid_distance"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="project",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="events", to="novelforge_sessions.project"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "novelforge_sessions_event" ("project_id")',
                ),
            ],
        ),
    ]
