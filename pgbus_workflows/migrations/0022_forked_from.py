# A run that fork() started names the run it copied its earlier steps from. Nullable and without
# an index (nothing looks runs up by it): code older than the column still inserts runs.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgbus_workflows", "0021_parked_steps"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="forked_from",
            field=models.UUIDField(blank=True, null=True, verbose_name="forked from"),
        ),
    ]
