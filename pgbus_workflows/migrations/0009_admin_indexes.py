# The indexes that keep the admin fast on a million runs (docs/architecture.md, "Operating at scale"): steps by
# when they finished (the dashboard's last hour), and small partial indexes on the rare rows
# the lists filter by (unsuccessful attempts and jobs, pending signals, notable events).
# Built CONCURRENTLY (no long lock on a big table), hence atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

INDEXES = {
    'fanoutjob': models.Index(condition=models.Q(('status__in', ['cancelled', 'failed'])), fields=['id'], name='pgbus_wf_job_unsuccessful'),
    'workflowevent': models.Index(condition=models.Q(('kind__in', ('cancelled', 'paused', 'resumed', 'resumed_at', 'step_failed', 'step_reattempted', 'step_skipped', 'step_stalled', 'step_timed_out', 'sweep_failed'))), fields=['kind', 'id'], name='pgbus_wf_event_notable'),
    'workflowsignal': models.Index(condition=models.Q(('status', 'pending')), fields=['id'], name='pgbus_wf_signal_unconsumed'),
}
STEP_INDEXES = [
    models.Index(condition=models.Q(('finished_at__isnull', False)), fields=['finished_at'], name='pgbus_wf_step_finished'),
    models.Index(condition=models.Q(('status__in', ['cancelled', 'failed', 'skipped'])), fields=['id'], name='pgbus_wf_step_unsuccessful'),
]
ALL = [*INDEXES.items(), *(('workflowstep', index) for index in STEP_INDEXES)]


def forwards(apps, schema_editor):
    for model_name, index in ALL:
        schema.create_index(schema_editor, apps.get_model('pgbus_workflows', model_name), index)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [index.name for _model, index in ALL])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0008_trace_context'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name=model_name, index=index) for model_name, index in ALL],
        ),
        migrations.RunPython(forwards, backwards),
    ]
