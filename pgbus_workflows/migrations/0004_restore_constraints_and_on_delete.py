# Builds whatever the live database lacks of the indexes and constraints the models declare
# (on installs that ran the first 0002: pgbus_wf_one_active_step_per_run), concurrently, and
# has PostgreSQL enforce the foreign keys' ON DELETE (CASCADE for a run's children, SET NULL
# for the signal links), each added NOT VALID then validated: no long lock on a big table.

from django.db import migrations

from pgbus_workflows import schema


def _models(apps):
    return list(apps.get_app_config("pgbus_workflows").get_models())


def forwards(apps, schema_editor):
    schema.restore_declared(schema_editor, _models(apps))
    schema.enforce_on_delete(schema_editor, _models(apps))


def backwards(apps, schema_editor):
    schema.enforce_on_delete(schema_editor, _models(apps), enforce=False)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0003_workers_alive_and_job_stalls'),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
