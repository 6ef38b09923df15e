"""Handoffs created for agent-review slots before ``Handoff.purpose`` existed are review
handoffs: mark them so the plain handoff routes refuse them."""

from django.db import migrations


def mark_review_handoffs(apps, schema_editor):
    Handoff = apps.get_model("control", "Handoff")
    Handoff.objects.filter(review_assignment__isnull=False).update(purpose="review")


class Migration(migrations.Migration):

    dependencies = [
        ("control", "0002_handoff_purpose"),
        ("reviews", "0002_assignment_handoff"),
    ]

    operations = [
        migrations.RunPython(mark_review_handoffs, migrations.RunPython.noop),
    ]
