# Schedules (WorkflowSchedule, ScheduleEvent) and the run's schedule and tick. The one-run-per-tick
# unique index on the runs table is built CONCURRENTLY (no long lock on a big table), and
# PostgreSQL enforces the new foreign keys' ON DELETE (retention deletes runs in raw SQL).

import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

from pgbus_workflows import schema

ONE_RUN_PER_TICK = models.UniqueConstraint(
    condition=models.Q(('schedule__isnull', False)), fields=('schedule', 'scheduled_for'), name='pgbus_wf_one_run_per_tick'
)


def forwards(apps, schema_editor):
    app_models = list(apps.get_app_config('pgbus_workflows').get_models())
    schema.add_declared(schema_editor, apps.get_model('pgbus_workflows', 'WorkflowRun'), ONE_RUN_PER_TICK.name)
    schema.enforce_on_delete(schema_editor, app_models)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [ONE_RUN_PER_TICK.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0005_dispatcher_catalog'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='scheduled_for',
            field=models.DateTimeField(blank=True, null=True, verbose_name='scheduled for'),
        ),
        migrations.CreateModel(
            name='WorkflowSchedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255, verbose_name='name')),
                ('workflow_class', models.CharField(max_length=255, verbose_name='workflow class')),
                ('cron', models.CharField(blank=True, default='', max_length=255, verbose_name='cron')),
                ('every', models.DurationField(blank=True, null=True, verbose_name='every')),
                ('timezone', models.CharField(default='UTC', max_length=64, verbose_name='time zone')),
                ('arguments', models.JSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='arguments')),
                ('overlap', models.CharField(choices=[('skip', 'skip'), ('allow', 'allow'), ('cancel_previous', 'cancel_previous')], default='skip', max_length=16, verbose_name='overlap')),
                ('catchup', models.CharField(choices=[('latest', 'latest'), ('all', 'all'), ('none', 'none')], default='latest', max_length=16, verbose_name='catch-up')),
                ('jitter', models.DurationField(blank=True, null=True, verbose_name='jitter')),
                ('enabled', models.BooleanField(default=True, verbose_name='enabled')),
                ('declared', models.BooleanField(default=False, verbose_name='declared in code')),
                ('paused', models.BooleanField(default=False, verbose_name='paused')),
                ('next_fire_at', models.DateTimeField(blank=True, null=True, verbose_name='next fire at')),
                ('due_at', models.DateTimeField(blank=True, null=True, verbose_name='due at')),
                ('last_fired_at', models.DateTimeField(blank=True, null=True, verbose_name='last fired at')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
                ('last_run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='pgbus_workflows.workflowrun', verbose_name='last run')),
            ],
            options={
                'verbose_name': 'workflow schedule',
                'verbose_name_plural': 'workflow schedules',
                'ordering': ('workflow_class', 'name'),
                'permissions': [('pause_workflowschedule', 'Can pause and resume workflow schedules'), ('fire_workflowschedule', 'Can fire workflow schedules now')],
            },
        ),
        migrations.CreateModel(
            name='ScheduleEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('created', 'created'), ('changed', 'changed in code'), ('paused', 'paused'), ('resumed', 'resumed'), ('fired_now', 'fired now'), ('tick_skipped', 'tick skipped (overlap)'), ('ticks_missed', 'ticks missed (catch-up)'), ('previous_cancelled', 'previous run cancelled'), ('tick_failed', 'tick failed')], max_length=32, verbose_name='kind')),
                ('actor', models.CharField(blank=True, default='', max_length=255, verbose_name='actor')),
                ('reason', models.TextField(blank=True, default='', verbose_name='reason')),
                ('details', models.JSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='details')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='pgbus_workflows.workflowrun', verbose_name='run')),
                ('schedule', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='pgbus_workflows.workflowschedule', verbose_name='schedule')),
            ],
            options={
                'verbose_name': 'schedule event',
                'verbose_name_plural': 'schedule events',
                'ordering': ('id',),
            },
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='schedule',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='pgbus_workflows.workflowschedule', verbose_name='schedule'),
        ),
        migrations.AddIndex(
            model_name='workflowschedule',
            index=models.Index(condition=models.Q(('enabled', True), ('paused', False)), fields=['due_at'], name='pgbus_wf_schedule_due'),
        ),
        migrations.AddConstraint(
            model_name='workflowschedule',
            constraint=models.UniqueConstraint(fields=('workflow_class', 'name'), name='pgbus_wf_schedule_unique_name'),
        ),
        migrations.AddConstraint(
            model_name='workflowschedule',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('cron', ''), ('every__isnull', False)), models.Q(models.Q(('cron', ''), _negated=True), ('every__isnull', True)), _connector='OR'), name='pgbus_wf_schedule_cron_or_every'),
        ),
        migrations.AddConstraint(
            model_name='workflowschedule',
            constraint=models.CheckConstraint(condition=models.Q(('overlap__in', ('skip', 'allow', 'cancel_previous'))), name='pgbus_wf_schedule_overlap'),
        ),
        migrations.AddConstraint(
            model_name='workflowschedule',
            constraint=models.CheckConstraint(condition=models.Q(('catchup__in', ('latest', 'all', 'none'))), name='pgbus_wf_schedule_catchup'),
        ),
        migrations.AddIndex(
            model_name='scheduleevent',
            index=models.Index(fields=['schedule', 'id'], name='pgbus_wf_schedule_event'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddConstraint(model_name='workflowrun', constraint=ONE_RUN_PER_TICK)],
        ),
        migrations.RunPython(forwards, backwards),
    ]
