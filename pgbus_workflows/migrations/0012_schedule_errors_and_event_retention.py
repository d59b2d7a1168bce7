# A schedule records why its last tick (or its sync from code) failed (last_error,
# last_error_at), and the sweep deletes schedule events older than RETENTION through an index
# on their age. The columns have database defaults, so code older than them (a rolling
# deploy) still inserts schedules; the index is built CONCURRENTLY, hence atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

EVENT_AGE = models.Index(fields=['created_at'], name='pgbus_wf_schedule_event_age')


def forwards(apps, schema_editor):
    schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'scheduleevent'), EVENT_AGE)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [EVENT_AGE.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0011_held_steps'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowschedule',
            name='last_error',
            field=models.TextField(blank=True, db_default='', default='', verbose_name='last error'),
        ),
        migrations.AddField(
            model_name='workflowschedule',
            name='last_error_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='last error at'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='scheduleevent', index=EVENT_AGE)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
