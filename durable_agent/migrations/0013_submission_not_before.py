"""Delayed work and retries (``Submission.not_before``), and the settlement notification.

On PostgreSQL a trigger on the submission table notifies the channel
``durable_agent_settled`` with the submission's id when a row becomes settled; PostgreSQL
delivers it at commit. ``durable_agent.wait`` listens on it (``durable_agent/agents/waiting.py``).
Other databases get no trigger: ``wait`` polls there.
"""

from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION da_submission_settled_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'settled' AND (TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM 'settled') THEN
        PERFORM pg_notify('durable_agent_settled', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS da_submission_settled_notify ON durable_agent_submission;
CREATE TRIGGER da_submission_settled_notify
    AFTER INSERT OR UPDATE OF state ON durable_agent_submission
    FOR EACH ROW EXECUTE FUNCTION da_submission_settled_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS da_submission_settled_notify ON durable_agent_submission;
DROP FUNCTION IF EXISTS da_submission_settled_notify();
"""


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0012_api_submit_scope_label"),
    ]

    operations = [
        migrations.AddField(
            model_name="submission",
            name="not_before",
            field=models.DateTimeField(
                blank=True,
                help_text=(
                    "The agent does not start before this time: a delayed submission, or the "
                    "next try of a retried one (docs/first-agent.md)."
                ),
                null=True,
            ),
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
