# Fairness (``dsl.fairness``): a step of a class with ``Fairness``, scheduled due at once, stores
# its key and its place in the claims' order (``fair_at``; one scheduled for later, its key
# alone until a claim places it as it comes due). Three partial indexes hold only such steps:
# the claimable ones in fair order (a claim of a catalog with fairness reads them beside the
# due index), those scheduled for later with no place yet, and each key's waiting ones (where
# its next step goes). Steps of other classes
# enter neither. The columns have database defaults (code older than them still inserts steps); the
# indexes are built CONCURRENTLY, hence atomic = False. Code older than this claims every step
# through the due index, in due order, as before.

from django.db import migrations, models

from pgbus_workflows import schema

FAIR = models.Index(
    condition=models.Q(('fair_at__isnull', False), ('held', False), ('parked', False), ('status', 'scheduled')),
    fields=['priority', 'fair_at', 'scheduled_at', 'id'],
    name='pgbus_wf_step_fair',
)
FAIR_LATER = models.Index(
    condition=models.Q(
        ('fair_at__isnull', True), ('fair_key__gt', ''), ('held', False), ('parked', False), ('status', 'scheduled')
    ),
    fields=['scheduled_at'],
    name='pgbus_wf_step_fair_later',
)
FAIR_KEY = models.Index(
    condition=models.Q(('fair_at__isnull', False), ('status', 'scheduled')),
    fields=['fair_key', 'fair_at'],
    name='pgbus_wf_step_fair_key',
)


def forwards(apps, schema_editor):
    model = apps.get_model('pgbus_workflows', 'workflowstep')
    schema.create_index(schema_editor, model, FAIR)
    schema.create_index(schema_editor, model, FAIR_LATER)
    schema.create_index(schema_editor, model, FAIR_KEY)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [FAIR_KEY.name, FAIR_LATER.name, FAIR.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0025_run_hours'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowstep',
            name='fair_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='fair order'),
        ),
        migrations.AddField(
            model_name='workflowstep',
            name='fair_key',
            field=models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='fairness key'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name='workflowstep', index=FAIR),
                migrations.AddIndex(model_name='workflowstep', index=FAIR_LATER),
                migrations.AddIndex(model_name='workflowstep', index=FAIR_KEY),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
