# Child workflows: a run's parent, the parent's fan-out job that stands for it, what the
# parent's end does to it, its depth, and whether someone waits for its result. The two
# partial indexes hold child runs only; they are built CONCURRENTLY (no long lock on a big
# table), and PostgreSQL enforces the new foreign keys' ON DELETE (retention deletes in raw SQL).

import django.db.models.deletion
from django.db import migrations, models

from pgbus_workflows import schema

CHILDREN = models.Index(fields=['parent', 'id'], condition=models.Q(('parent__isnull', False)), name='pgbus_wf_run_children')
PARENT_JOB = models.Index(fields=['parent_job'], condition=models.Q(('parent_job__isnull', False)), name='pgbus_wf_run_parent_job')


def forwards(apps, schema_editor):
    run = apps.get_model('pgbus_workflows', 'WorkflowRun')
    for index in (CHILDREN, PARENT_JOB):
        schema.add_declared(schema_editor, run, index.name)
    schema.enforce_on_delete(schema_editor, [run])


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [CHILDREN.name, PARENT_JOB.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0006_schedules'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='parent',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='pgbus_workflows.workflowrun', verbose_name='parent run'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='parent_job',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='pgbus_workflows.fanoutjob', verbose_name="parent's fan-out job"),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='parent_close',
            field=models.CharField(blank=True, db_default='', default='', max_length=16, verbose_name='parent close'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='depth',
            field=models.PositiveSmallIntegerField(db_default=0, default=0, verbose_name='depth'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='awaited',
            field=models.BooleanField(db_default=False, default=False, verbose_name='awaited'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name='workflowrun', index=CHILDREN),
                migrations.AddIndex(model_name='workflowrun', index=PARENT_JOB),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
