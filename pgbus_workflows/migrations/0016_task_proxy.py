# DjangoTask: the task backend's runs as the admin lists them, a proxy of WorkflowRun (no table,
# no SQL: the migration only records the model, for its admin permissions).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('pgbus_workflows', '0015_limiters'),
    ]

    operations = [
        migrations.CreateModel(
            name='DjangoTask',
            fields=[
            ],
            options={
                'verbose_name': 'task',
                'verbose_name_plural': 'tasks',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('pgbus_workflows.workflowrun',),
        ),
    ]
