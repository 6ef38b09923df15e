"""The write path's foreign keys lose the single-column indexes a composite index already covers.

Each of these indexes is the leading column of a unique or composite index
(``artifact_name_unique_per_project``, ``artifact_version_number_unique``, ``checkpoint_session_id``,
``checkpoint_seq_unique_per_run``), which serves every lookup by it, the cascades included, so
the FK's own index only cost every insert one more index entry; and on a table without
statistics yet, the planner picked the narrow index and filtered every row of the project with
it. ``ArtifactVersion.fingerprint`` is only compared for equality: its ``varchar_pattern_ops``
twin (what ``db_index=True`` adds) goes too.

Django's AlterField would drop and re-add each foreign key constraint around its index
(re-validating it: a full scan under lock), so the database side is only the indexes (as in 0006).
"""
import django.db.models.deletion
from django.db import migrations, models

DROPPED = {
    "novelforge_sessions_artifact": [("novelforge_sessions_artifact_project_id_10cf7ad4", "project_id")],
    "novelforge_sessions_artifactversion": [
        ("novelforge_sessions_artifactversion_artifact_id_e3dee7ea", "artifact_id"),
        ("novelforge_sessions_artifactversion_fingerprint_d300c9f2", "fingerprint"),
    ],
    "novelforge_sessions_checkpoint": [
        ("novelforge_sessions_checkpoint_session_id_1e476796", "session_id"),
        ("novelforge_sessions_checkpoint_run_id_f173d98a", "run_id"),
    ],
}
LIKE = "novelforge_sessions_artifactversion_fingerprint_d300c9f2_like"


def _sql() -> list[migrations.RunSQL]:
    ops = [migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                             f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")')
           for table, indexes in DROPPED.items() for name, column in indexes]
    ops.append(migrations.RunSQL(
        f'DROP INDEX IF EXISTS "{LIKE}"',
        f'CREATE INDEX IF NOT EXISTS "{LIKE}" ON "novelforge_sessions_artifactversion" ("fingerprint" varchar_pattern_ops)'))
    return ops


class Migration(migrations.Migration):

    dependencies = [
        ("novelforge_sessions", "0009_language_preference"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="artifact", name="project",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="artifacts", to="novelforge_sessions.project"),
                ),
                migrations.AlterField(
                    model_name="artifactversion", name="artifact",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="versions", to="novelforge_sessions.artifact"),
                ),
                migrations.AlterField(
                    model_name="artifactversion", name="fingerprint", field=models.CharField(max_length=71),
                ),
                migrations.AlterField(
                    model_name="checkpoint", name="run",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="checkpoints", to="novelforge_sessions.run"),
                ),
                migrations.AlterField(
                    model_name="checkpoint", name="session",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="checkpoints", to="novelforge_sessions.session"),
                ),
            ],
            database_operations=_sql(),
        ),
        migrations.AddIndex(
            model_name="artifactversion",
            index=models.Index(fields=["fingerprint"], name="artifact_version_fingerprint"),
        ),
    ]
