# The caller's trace context saved at start() (pgbus_workflows.tracing). A nullable column without a
# default: PostgreSQL adds it without rewriting or scanning the runs table.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgbus_workflows', '0007_children'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='trace_context',
            field=models.JSONField(blank=True, editable=False, null=True, verbose_name='trace context'),
        ),
    ]
