# Insights' window starts at scale: the two rollups are kept by five-minute span too
# (``WorkflowStepSpan``, ``WorkflowRunSpan``: new tables, kept seven days and an hour), and each mark
# says where its spans begin (``spans_from``, null until the first sweep after the upgrade, which
# sets it to the next span's start). Nothing existing is rewritten: a window whose start is older
# than the spans is read as before, its first hour's edge from the attempts and runs.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgbus_workflows', '0027_due_time_statistics'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrollupmark',
            name='spans_from',
            field=models.DateTimeField(blank=True, null=True, verbose_name='spans from'),
        ),
        migrations.CreateModel(
            name='WorkflowRunSpan',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('workflow_class', models.CharField(max_length=255, verbose_name='workflow class')),
                ('step_name', models.CharField(blank=True, max_length=255, verbose_name='step')),
                ('reached', models.IntegerField(default=0, verbose_name='reached')),
                ('finished', models.IntegerField(default=0, verbose_name='finished')),
                ('cancelled', models.IntegerField(default=0, verbose_name='cancelled')),
                ('start', models.DateTimeField(verbose_name='start')),
            ],
            options={
                'verbose_name': 'run span',
                'verbose_name_plural': 'run spans',
                'indexes': [models.Index(fields=['start'], name='pgbus_wf_run_span_age')],
                'constraints': [models.UniqueConstraint(fields=('workflow_class', 'start', 'step_name'), name='pgbus_wf_run_span')],
            },
        ),
        migrations.CreateModel(
            name='WorkflowStepSpan',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('workflow_class', models.CharField(max_length=255, verbose_name='workflow class')),
                ('step_name', models.CharField(max_length=255, verbose_name='step')),
                ('attempts', models.IntegerField(default=0, verbose_name='attempts')),
                ('completed', models.IntegerField(default=0, verbose_name='completed')),
                ('failed', models.IntegerField(default=0, verbose_name='failed')),
                ('skipped', models.IntegerField(default=0, verbose_name='skipped')),
                ('cancelled', models.IntegerField(default=0, verbose_name='cancelled')),
                ('reattempts', models.IntegerField(default=0, verbose_name='reattempts')),
                ('durations', models.JSONField(default=dict, verbose_name='durations')),
                ('start', models.DateTimeField(verbose_name='start')),
            ],
            options={
                'verbose_name': 'step span',
                'verbose_name_plural': 'step spans',
                'indexes': [models.Index(fields=['start'], name='pgbus_wf_step_span_age')],
                'constraints': [models.UniqueConstraint(fields=('workflow_class', 'start', 'step_name'), name='pgbus_wf_step_span')],
            },
        ),
    ]
