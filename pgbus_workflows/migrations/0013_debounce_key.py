# A run started by a debounced class's start() stores its debounce key; later starts of that
# key find the run (while it is ready) through a partial index that no other run enters, so
# the index costs classes without debounce nothing. The column is nullable, so code older
# than it (a rolling deploy) still inserts runs; the index is built CONCURRENTLY, hence
# atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

DEBOUNCE = models.Index(
    condition=models.Q(('debounce_key__isnull', False), ('status', 'ready')),
    fields=['workflow_class', 'debounce_key'],
    name='pgbus_wf_run_debounce',
)


def forwards(apps, schema_editor):
    schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowrun'), DEBOUNCE)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [DEBOUNCE.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0012_schedule_errors_and_event_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='debounce_key',
            field=models.CharField(blank=True, editable=False, max_length=255, null=True, verbose_name='debounce key'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowrun', index=DEBOUNCE)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
