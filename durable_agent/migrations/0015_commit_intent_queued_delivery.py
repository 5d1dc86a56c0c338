"""The commit function keeps a queued delivery (PostgreSQL only).

``sql/0015_commit_intent.sql`` replaces the function of migration 0010: a fired slot whose
delivery is queued counts as armed at its deadline, and any write of the slot clears its task
(Note [A queued delivery holds the slot] in ``durable_agent/maintenance/store/rows.py``). It
takes one more argument, so the old signature is dropped first. On any other database this
migration does nothing.
"""

from pathlib import Path

from django.db import migrations

SQL_DIR = Path(__file__).resolve().parent / "sql"
OLD_ARGS = (
    "bigint, text[], timestamptz[], integer[], boolean[], text, bigint, boolean, timestamptz, "
    "boolean, timestamptz, timestamptz, integer, timestamptz, text, text"
)
DROP_OLD = f"DROP FUNCTION IF EXISTS durable_agent_commit_intent({OLD_ARGS})"
DROP_NEW = f"DROP FUNCTION IF EXISTS durable_agent_commit_intent({OLD_ARGS}, timestamptz)"


def _run(schema_editor, *statements):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:  # no params: the SQL holds '%'
            for sql in statements:
                cursor.execute(sql)


def install(apps, schema_editor):
    _run(schema_editor, DROP_OLD, (SQL_DIR / "0015_commit_intent.sql").read_text())


def uninstall(apps, schema_editor):
    _run(schema_editor, DROP_NEW, (SQL_DIR / "0010_commit_intent.sql").read_text())


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0014_submission_list_indexes"),
    ]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
