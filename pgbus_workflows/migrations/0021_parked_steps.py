# A scheduled attempt that a claim finds held back by a limiter with no room is parked: the due
# index orders it after its priority's claimable attempts (``parked``), so claims of every class
# no longer walk a full key's waiting steps; ``parked_on`` names the limiter, and a new partial
# index holds the parked attempts in the order a claim puts them back when the key has room
# (and the held-back counts read it alone). The index of scheduled attempts under limits leaves
# the parked ones out. The columns have database defaults (code older than them still inserts
# steps); the indexes are built CONCURRENTLY and take the old ones' names (schema.replace_index),
# hence atomic = False. Code older than this keeps claiming through the new due index, by a
# slower range (its priority's claimable steps, sorted) until it is replaced.

from django.db import migrations, models

from pgbus_workflows import schema

OLD_DUE = models.Index(condition=models.Q(('status', 'scheduled')), fields=['priority', 'held', 'scheduled_at', 'id'], name='pgbus_wf_step_due')
NEW_DUE = models.Index(condition=models.Q(('status', 'scheduled')), fields=['priority', 'held', 'parked', 'scheduled_at', 'id'], name='pgbus_wf_step_due')
OLD_LIMITED = models.Index(
    condition=models.Q(('held', False), ('limiters__isnull', False), ('status', 'scheduled')),
    fields=['scheduled_at'],
    name='pgbus_wf_step_limited',
)
NEW_LIMITED = models.Index(
    condition=models.Q(('held', False), ('limiters__isnull', False), ('parked', False), ('status', 'scheduled')),
    fields=['scheduled_at'],
    name='pgbus_wf_step_limited',
)
PARKED = models.Index(
    condition=models.Q(('parked', True), ('status', 'scheduled')),
    fields=['parked_on', 'priority', 'scheduled_at', 'id'],
    include=('step_name', 'run'),
    name='pgbus_wf_step_parked',
)


def forwards(apps, schema_editor):
    model = apps.get_model('pgbus_workflows', 'workflowstep')
    schema.replace_index(schema_editor, model, OLD_DUE, NEW_DUE)
    schema.replace_index(schema_editor, model, OLD_LIMITED, NEW_LIMITED)
    schema.create_index(schema_editor, model, PARKED)


def backwards(apps, schema_editor):
    model = apps.get_model('pgbus_workflows', 'workflowstep')
    schema.drop_indexes(schema_editor, [PARKED.name])
    schema.replace_index(schema_editor, model, NEW_LIMITED, OLD_LIMITED)
    schema.replace_index(schema_editor, model, NEW_DUE, OLD_DUE)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0020_cancelled_slots'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowstep',
            name='parked',
            field=models.BooleanField(db_default=False, default=False, verbose_name='parked by a limit'),
        ),
        migrations.AddField(
            model_name='workflowstep',
            name='parked_on',
            field=models.CharField(blank=True, db_default='', default='', max_length=300, verbose_name='parked on'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name='workflowstep', name='pgbus_wf_step_due'),
                migrations.AddIndex(model_name='workflowstep', index=NEW_DUE),
                migrations.RemoveIndex(model_name='workflowstep', name='pgbus_wf_step_limited'),
                migrations.AddIndex(model_name='workflowstep', index=NEW_LIMITED),
                migrations.AddIndex(model_name='workflowstep', index=PARKED),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
