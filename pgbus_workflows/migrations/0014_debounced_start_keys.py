# A start with an idempotency key that collapses into a debounced run records the key in its
# 'debounced' event; a later start with that key finds the run through this index, which
# holds the 'debounced' events only (no other event enters it, so it costs their inserts
# nothing). Built CONCURRENTLY on the events table, hence atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

DEBOUNCED_KEY = models.Index(
    models.F('details__idempotency_key'),
    condition=models.Q(('kind', 'debounced')),
    name='pgbus_wf_event_debounced_key',
)


def forwards(apps, schema_editor):
    schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowevent'), DEBOUNCED_KEY)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [DEBOUNCED_KEY.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0013_debounce_key'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowevent', index=DEBOUNCED_KEY)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
