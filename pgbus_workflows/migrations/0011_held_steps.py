# A paused run's scheduled attempt is held: the due index puts it after its priority's
# claimable attempts, so claims no longer read (and pass over, one by one) the due steps of
# paused runs. The column has a database default, so code older than it (a rolling deploy)
# still inserts steps; the index is rebuilt CONCURRENTLY under another name, then takes the
# old one's name (schema.replace_index), hence atomic = False. Code older than this keeps
# claiming through the new index, by a slower range (its priority's scheduled steps, sorted)
# until it is replaced.

from django.db import migrations, models

from pgbus_workflows import schema

OLD = models.Index(condition=models.Q(('status', 'scheduled')), fields=['priority', 'scheduled_at', 'id'], name='pgbus_wf_step_due')
NEW = models.Index(condition=models.Q(('status', 'scheduled')), fields=['priority', 'held', 'scheduled_at', 'id'], name='pgbus_wf_step_due')


def forwards(apps, schema_editor):
    schema.replace_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowstep'), OLD, NEW)


def backwards(apps, schema_editor):
    schema.replace_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowstep'), NEW, OLD)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0010_partial_foreign_key_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowstep',
            name='held',
            field=models.BooleanField(db_default=False, default=False, verbose_name='held by a pause'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name='workflowstep', name='pgbus_wf_step_due'),
                migrations.AddIndex(model_name='workflowstep', index=NEW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
