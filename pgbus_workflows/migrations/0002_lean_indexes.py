# Rewritten after release: the first version altered the run foreign keys to db_index=False,
# which makes Django drop every btree index on run_id, the partial unique index
# pgbus_wf_one_active_step_per_run included, and drop and re-add (re-validate) the foreign
# keys under ACCESS EXCLUSIVE locks. This version changes the same migration state, but on
# the database only drops the three redundant indexes by name and builds the new one
# concurrently (non-atomic), and its reverse restores them. Installs that ran the first
# version get the lost index back from 0004.

import django.db.models.deletion
from django.db import migrations, models

from pgbus_workflows import schema

#: The indexes 0001 made that this migration makes redundant: (model, column, suffix).
REDUNDANT = [
    ("workflowstep", "run_id", ""),
    ("workflowevent", "run_id", ""),
    ("workflowrun", "workflow_class", ""),
    ("workflowrun", "workflow_class", "_like"),
]
CLASS_STATUS = models.Index(fields=["workflow_class", "status"], name="pgbus_wf_run_class_status")


def _names(apps, schema_editor):
    for model_name, column, suffix in REDUNDANT:
        table = apps.get_model("pgbus_workflows", model_name)._meta.db_table
        if suffix and schema_editor.connection.vendor != "postgresql":
            continue  # the LIKE index is PostgreSQL's
        yield schema_editor._create_index_name(table, [column], suffix=suffix)


def forwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, list(_names(apps, schema_editor)))
    schema.create_index(schema_editor, apps.get_model("pgbus_workflows", "WorkflowRun"), CLASS_STATUS)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [CLASS_STATUS.name])
    for (model_name, column, suffix), name in zip(REDUNDANT, _names(apps, schema_editor)):
        model = apps.get_model("pgbus_workflows", model_name)
        opclasses = ["varchar_pattern_ops"] if suffix else []
        schema.create_index(schema_editor, model, models.Index(fields=[model._meta.get_field(column.removesuffix("_id")).name], name=name, opclasses=opclasses))


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='workflowevent',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='pgbus_workflows.workflowrun', verbose_name='run'),
                ),
                migrations.AlterField(
                    model_name='workflowrun',
                    name='workflow_class',
                    field=models.CharField(max_length=255, verbose_name='workflow class'),
                ),
                migrations.AlterField(
                    model_name='workflowstep',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='pgbus_workflows.workflowrun', verbose_name='run'),
                ),
                migrations.AddIndex(model_name='workflowrun', index=CLASS_STATUS),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
