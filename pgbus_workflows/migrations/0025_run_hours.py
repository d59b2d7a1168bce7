# Insights' funnel at scale: a new table of the runs that ended, counted by class, the hour they
# started in and step (``WorkflowRunHour``, which the sweep's rollups phase fills under its own mark
# in ``WorkflowRollupMark``), and the pipeline's partial index of ongoing runs rebuilt led by class
# and start (with the current step, status and id: the funnel's ongoing runs of a window read from
# it alone, the pipeline as before). The index is built CONCURRENTLY under another name and takes
# the old one's (schema.replace_index), hence atomic = False. Older code reads the new index as it
# read the old one.

from django.db import migrations, models

from pgbus_workflows import schema

ONGOING = models.Q(('status__in', ['paused', 'performing', 'ready', 'waiting']))
OLD_PIPELINE = models.Index(condition=ONGOING, fields=['workflow_class', 'current_step', 'status'], name='pgbus_wf_run_pipeline')
NEW_PIPELINE = models.Index(
    condition=ONGOING, fields=['workflow_class', 'started_at', 'current_step', 'status', 'id'], name='pgbus_wf_run_pipeline'
)


def forwards(apps, schema_editor):
    schema.replace_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowrun'), OLD_PIPELINE, NEW_PIPELINE)


def backwards(apps, schema_editor):
    schema.replace_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowrun'), NEW_PIPELINE, OLD_PIPELINE)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0024_step_hours'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkflowRunHour',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('workflow_class', models.CharField(max_length=255, verbose_name='workflow class')),
                ('step_name', models.CharField(blank=True, max_length=255, verbose_name='step')),
                ('hour', models.DateTimeField(verbose_name='hour')),
                ('reached', models.IntegerField(default=0, verbose_name='reached')),
                ('finished', models.IntegerField(default=0, verbose_name='finished')),
                ('cancelled', models.IntegerField(default=0, verbose_name='cancelled')),
            ],
            options={
                'verbose_name': 'run hour',
                'verbose_name_plural': 'run hours',
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name='workflowrun', name='pgbus_wf_run_pipeline'),
                migrations.AddIndex(model_name='workflowrun', index=NEW_PIPELINE),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
        migrations.AddIndex(
            model_name='workflowrunhour',
            index=models.Index(fields=['hour'], name='pgbus_wf_run_hour_age'),
        ),
        migrations.AddConstraint(
            model_name='workflowrunhour',
            constraint=models.UniqueConstraint(fields=('workflow_class', 'hour', 'step_name'), name='pgbus_wf_run_hour'),
        ),
    ]
