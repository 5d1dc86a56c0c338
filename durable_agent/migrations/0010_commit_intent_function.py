"""The server-side commit of gate.transaction's intent (PostgreSQL only).

Note [The commit function] in ``sql/0010_commit_intent.sql`` explains what it does. The SQL is
read from that file, which belongs to this migration: a later change gets a new file and a new
migration. On any other database this migration does nothing.
"""

from pathlib import Path

from django.db import migrations

SQL = (Path(__file__).resolve().parent / "sql" / "0010_commit_intent.sql").read_text()
DROP = (
    "DROP FUNCTION IF EXISTS durable_agent_commit_intent("
    "bigint, text[], timestamptz[], integer[], boolean[], text, bigint, boolean, timestamptz, "
    "boolean, timestamptz, timestamptz, integer, timestamptz, text, text)"
)


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:  # no params: the SQL holds '%'
            cursor.execute(SQL)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0009_schedule_notify"),
    ]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
