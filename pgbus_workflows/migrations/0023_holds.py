# Holds (services.holding): a row per hold of a workflow class or a queue, kept after its
# release as the audit trail; the partial unique index of the active ones is what every claim
# reads (one descent of an empty index when nothing is held). The permission hold_workflowrun.

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgbus_workflows', '0022_forked_from'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workflowrun',
            options={'ordering': ('-id',), 'permissions': [('pause_workflowrun', 'Can pause and resume workflow runs'), ('cancel_workflowrun', 'Can cancel workflow runs'), ('rerun_workflowrun', 'Can rerun workflow runs'), ('run_now_workflowrun', "Can run a workflow run's step now"), ('skip_workflowrun', "Can skip a workflow run's step"), ('signal_workflowrun', 'Can deliver signals to workflow runs'), ('hold_workflowrun', 'Can hold and release a workflow class or a queue')], 'verbose_name': 'workflow run', 'verbose_name_plural': 'workflow runs'},
        ),
        migrations.CreateModel(
            name='WorkflowHold',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('class', 'workflow class'), ('queue', 'queue')], max_length=8, verbose_name='kind')),
                ('name', models.CharField(max_length=200, verbose_name='name')),
                ('held_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='held at')),
                ('held_by', models.CharField(max_length=200, verbose_name='held by')),
                ('reason', models.TextField(verbose_name='reason')),
                ('released_at', models.DateTimeField(blank=True, null=True, verbose_name='released at')),
                ('released_by', models.CharField(blank=True, default='', max_length=200, verbose_name='released by')),
                ('release_reason', models.TextField(blank=True, default='', verbose_name='release reason')),
            ],
            options={
                'verbose_name': 'workflow hold',
                'verbose_name_plural': 'workflow holds',
                'ordering': ('-held_at',),
                'constraints': [models.UniqueConstraint(condition=models.Q(('released_at__isnull', True)), fields=('kind', 'name'), name='pgbus_wf_hold_active')],
            },
        ),
    ]
