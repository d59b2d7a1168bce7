# The claims' due index keyed on a scheduled attempt's due time alone, an expression with
# statistics of its own (sql.due): behind a long finished history, ``scheduled_at``'s statistics
# made PostgreSQL expect nearly every waiting step to be due, and walk them all on every claim.
# The new index is built CONCURRENTLY under a name of its own, then takes the old one's
# (schema.replace_index), hence atomic = False; the extended statistics (PostgreSQL 14+) are
# filled by an ANALYZE of the steps, which reads a sample and lets reads and writes go on.
# Code older than this keeps claiming through the new index, by a slower range (its priority's
# claimable steps, sorted), until it is replaced.

from django.db import migrations, models

from pgbus_workflows import schema

OLD_DUE = models.Index(
    condition=models.Q(('status', 'scheduled')),
    fields=['priority', 'held', 'parked', 'scheduled_at', 'id'],
    name='pgbus_wf_step_due',
)
NEW_DUE = models.Index(
    models.F('priority'),
    models.F('held'),
    models.F('parked'),
    models.Case(models.When(status='scheduled', then=models.F('scheduled_at'))),
    models.F('id'),
    condition=models.Q(('status', 'scheduled')),
    name='pgbus_wf_step_due',
)
STATISTICS = 'pgbus_wf_step_due_at'
DUE_AT = "(CASE WHEN status = 'scheduled' THEN scheduled_at END)"


def forwards(apps, schema_editor):
    model = apps.get_model('pgbus_workflows', 'workflowstep')
    schema.replace_index(schema_editor, model, OLD_DUE, NEW_DUE)
    schema.create_statistics(schema_editor, model, STATISTICS, DUE_AT)


def backwards(apps, schema_editor):
    model = apps.get_model('pgbus_workflows', 'workflowstep')
    schema.drop_statistics(schema_editor, STATISTICS)
    schema.replace_index(schema_editor, model, NEW_DUE, OLD_DUE)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0026_fairness'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name='workflowstep', name='pgbus_wf_step_due'),
                migrations.AddIndex(model_name='workflowstep', index=NEW_DUE),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
