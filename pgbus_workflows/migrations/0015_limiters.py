# Concurrency and RateLimit: a step scheduled under a limit stores the names of its limiter rows
# (WorkflowStep.limiters, NULL for every other step: a nullable column is added without a
# rewrite, and code older than it still inserts steps); a limiter row holds a key's slots or
# its token bucket, locked by the claim. Its one index holds only the emptied buckets. The
# steps' new partial index holds only scheduled attempts under limits (the gauge reads what
# holds them back); it is built CONCURRENTLY, hence atomic = False.

import django.utils.timezone
from django.db import migrations, models

from pgbus_workflows import schema

LIMITED = models.Index(
    condition=models.Q(('held', False), ('limiters__isnull', False), ('status', 'scheduled')),
    fields=['scheduled_at'],
    name='pgbus_wf_step_limited',
)


def forwards(apps, schema_editor):
    schema.create_index(schema_editor, apps.get_model('pgbus_workflows', 'workflowstep'), LIMITED)


def backwards(apps, schema_editor):
    schema.drop_indexes(schema_editor, [LIMITED.name])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0014_debounced_start_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowstep',
            name='limiters',
            field=models.JSONField(blank=True, null=True, verbose_name='limiters'),
        ),
        migrations.CreateModel(
            name='WorkflowLimiter',
            fields=[
                ('name', models.CharField(max_length=300, primary_key=True, serialize=False, verbose_name='name')),
                ('kind', models.CharField(max_length=16, verbose_name='kind')),
                ('limit', models.PositiveIntegerField(verbose_name='limit')),
                ('in_use', models.IntegerField(default=0, verbose_name='in use')),
                ('per', models.DurationField(blank=True, null=True, verbose_name='per')),
                ('tokens', models.FloatField(blank=True, null=True, verbose_name='tokens')),
                ('refilled_at', models.DateTimeField(blank=True, null=True, verbose_name='refilled at')),
                ('available_at', models.DateTimeField(blank=True, null=True, verbose_name='next token at')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
            ],
            options={
                'verbose_name': 'workflow limiter',
                'verbose_name_plural': 'workflow limiters',
                'ordering': ('name',),
                'indexes': [models.Index(condition=models.Q(('available_at__isnull', False)), fields=['available_at'], name='pgbus_wf_limiter_refill')],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowstep', index=LIMITED)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
