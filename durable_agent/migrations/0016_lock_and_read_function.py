"""An alarm transaction's lock and read in one call (PostgreSQL only).

``sql/0016_lock_and_read.sql`` creates ``durable_agent_lock_and_read`` (Note [Lock and read in
one call] in ``durable_agent/maintenance/store/rows.py``). On any other database this
migration does nothing.
"""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).resolve().parent / "sql" / "0016_lock_and_read.sql"
DROP = "DROP FUNCTION IF EXISTS durable_agent_lock_and_read(bigint)"


def _run(schema_editor, sql):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:  # no params: the SQL holds '%'
            cursor.execute(sql)


def install(apps, schema_editor):
    _run(schema_editor, SQL.read_text())


def uninstall(apps, schema_editor):
    _run(schema_editor, DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0015_commit_intent_queued_delivery"),
    ]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
