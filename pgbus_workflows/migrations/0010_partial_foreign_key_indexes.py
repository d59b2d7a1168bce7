# Two foreign keys that are NULL on most rows get partial indexes in place of Django's full
# ones: an attempt's received signal (most attempts receive none) and an event's step (a run's
# own events have none). A NULL entry serves no lookup (ON DELETE's included: they look up
# one key), and each one costs every write of such a row: two index entries fewer per
# start() and per step (python -m bench.wal).
# The new indexes are built CONCURRENTLY before the old ones are dropped, hence atomic = False;
# the fields change in the state only (a real AlterField on a foreign key drops every btree
# index on its column: see pgbus_workflows.schema).

import django.db.models.deletion
from django.db import migrations, models

from pgbus_workflows import schema

INDEXES = [
    ('workflowstep', models.Index(condition=models.Q(('signal__isnull', False)), fields=['signal'], name='pgbus_wf_step_signal')),
    ('workflowevent', models.Index(condition=models.Q(('step__isnull', False)), fields=['step'], name='pgbus_wf_event_step')),
]
#: Django's own indexes of the two columns (db_index=True), as its schema editor named them.
REPLACED = [
    ('workflowstep', models.Index(fields=['signal'], name='pgbus_workflows_workflowstep_signal_id_7fb68881')),
    ('workflowevent', models.Index(fields=['step'], name='pgbus_workflows_workflowevent_step_id_1a08d976')),
]


def _swap(schema_editor, apps, build, drop):
    for model_name, index in build:
        schema.create_index(schema_editor, apps.get_model('pgbus_workflows', model_name), index)
    schema.drop_indexes(schema_editor, [index.name for _model, index in drop])


def forwards(apps, schema_editor):
    _swap(schema_editor, apps, INDEXES, REPLACED)


def backwards(apps, schema_editor):
    _swap(schema_editor, apps, REPLACED, INDEXES)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0009_admin_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='workflowevent',
                    name='step',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='pgbus_workflows.workflowstep', verbose_name='step'),
                ),
                migrations.AlterField(
                    model_name='workflowstep',
                    name='signal',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='pgbus_workflows.workflowsignal', verbose_name='received signal'),
                ),
                *(migrations.AddIndex(model_name=model_name, index=index) for model_name, index in INDEXES),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
