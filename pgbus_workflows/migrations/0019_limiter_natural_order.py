# The limiter list's order (admin.records.NaturalName): names by their numbers' values, so
# account:2 comes before account:10. PostgreSQL sorts so by an ICU collation with numeric
# ordering, walked through an index of its own; a server built without ICU gets a copy of "C"
# under the same name (plain order, nothing fails). Built CONCURRENTLY, hence atomic = False.
# SQLite sorts by the name itself: nothing to create.

from django.db import migrations

COLLATION = 'pgbus_workflows_natural'
INDEX = 'pgbus_wf_limiter_natural'
TABLE = 'pgbus_workflows_workflowlimiter'


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != 'postgresql':
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute('SELECT 1 FROM pg_collation WHERE collname = %s', [COLLATION])
        if cursor.fetchone() is None:
            cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i')")
            icu = cursor.fetchone()[0]
            source = "(provider = icu, locale = 'und-u-kn-true')" if icu else 'FROM "C"'
            cursor.execute(f'CREATE COLLATION IF NOT EXISTS {COLLATION} {source}')
        cursor.execute(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {TABLE} (name COLLATE {COLLATION})')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != 'postgresql':
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {INDEX}')
        cursor.execute(f'DROP COLLATION IF EXISTS {COLLATION}')


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('pgbus_workflows', '0018_dispatcher_session_lock'),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
