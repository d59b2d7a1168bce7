# The insights page's two indexes (docs/architecture.md, "Operating at scale"): the ongoing runs of
# a class by step and status (its pipeline; partial, so finished history costs it nothing), and
# the runs of a class by when they started (its funnel over a window), each answering from the
# index alone. Built CONCURRENTLY (no long lock on a big table), hence atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

INDEXES = [
    models.Index(
        condition=models.Q(('status__in', ['paused', 'performing', 'ready', 'waiting'])),
        fields=['workflow_class', 'current_step', 'status'],
        name='pgbus_wf_run_pipeline',
    ),
    models.Index(fields=['workflow_class', 'started_at', 'current_step', 'status', 'id'], name='pgbus_wf_run_class_started'),
]


def forwards(apps, schema_editor):
    for index in INDEXES:
        schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowrun'), index)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [index.name for index in INDEXES])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0016_task_proxy'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowrun', index=index) for index in INDEXES],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
