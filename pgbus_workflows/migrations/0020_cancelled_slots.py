# A cancelled attempt whose body may still run keeps its concurrency slots (holds_slots, and
# the partial index through which the sweep finds a stalled one's), and a limiter says when the
# sweep last repaired its slot count (repaired_at). Adding the columns rewrites nothing (a
# constant default); the index is built CONCURRENTLY (no long lock on a big table), hence
# atomic = False.

from django.db import migrations, models

from pgbus_workflows import schema

INDEX = models.Index(condition=models.Q(('holds_slots', True)), fields=['stall_at'], name='pgbus_wf_step_holds_slots')


def forwards(apps, schema_editor):
    schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowstep'), INDEX)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [INDEX.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0019_limiter_natural_order'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowlimiter',
            name='repaired_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='slots repaired at'),
        ),
        migrations.AddField(
            model_name='workflowstep',
            name='holds_slots',
            field=models.BooleanField(db_default=False, default=False, verbose_name='holds its slots'),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowstep', index=INDEX)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
