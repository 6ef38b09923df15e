"""The graph tables' foreign keys lose the single-column indexes their unique indexes cover.

``graph_thread_unique_per_project`` (project, thread_id), ``graph_cp_unique_id``,
``graph_blob_unique_version``, ``graph_write_unique_idx`` (thread, …) and
``graph_blob_chunk_unique_index`` (project, …) lead with the same column and serve every lookup
by it, the cascades included; the FK's own index only cost each insert, and on a table without
statistics yet the planner picked it and filtered every row of the thread or project with it.
Database side: only the indexes (Django's AlterField would drop and re-validate each foreign key).
"""
import django.db.models.deletion
from django.db import migrations, models

DROPPED = [
    ("control_graphthread", "control_graphthread_project_id_ed020d1c", "project_id"),
    ("control_graphcheckpoint", "control_graphcheckpoint_thread_id_bbbe5d5f", "thread_id"),
    ("control_graphblob", "control_graphblob_thread_id_6a6e84d7", "thread_id"),
    ("control_graphwrite", "control_graphwrite_thread_id_67e60572", "thread_id"),
    ("control_graphblobchunk", "control_graphblobchunk_project_id_bae7693b", "project_id"),
]


def _fk(to: str, related_name: str) -> models.ForeignKey:
    return models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name=related_name, to=to)


class Migration(migrations.Migration):

    dependencies = [
        ("control", "0005_graph_blob_chunks"),
        ("novelforge_sessions", "0010_write_path_fk_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="graphthread", name="project",
                                      field=_fk("novelforge_sessions.project", "graph_threads")),
                migrations.AlterField(model_name="graphcheckpoint", name="thread",
                                      field=_fk("control.graphthread", "checkpoints")),
                migrations.AlterField(model_name="graphblob", name="thread", field=_fk("control.graphthread", "blobs")),
                migrations.AlterField(model_name="graphwrite", name="thread", field=_fk("control.graphthread", "writes")),
                migrations.AlterField(model_name="graphblobchunk", name="project",
                                      field=_fk("novelforge_sessions.project", "+")),
            ],
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                                  f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")')
                for table, name, column in DROPPED
            ],
        ),
    ]
