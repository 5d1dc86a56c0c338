"""A trigger on django-q's Schedule table that wakes AlarmBroker (PostgreSQL only).

When a row becomes armed (inserted armed, re-armed from ``repeats = 0``, or its ``next_run``
moved) with a ``next_run`` at most two seconds ahead of the clock, it notifies the channel
``durable_agent_alarm`` with ``'<cluster> <next_run as epoch seconds>'``. PostgreSQL delivers
the notification at commit. Alarms armed further ahead notify nobody: the broker's probe finds
them before they are due (``durable_agent/alarm_listener.py``). Other databases get nothing.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION da_schedule_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.repeats <> 0
       AND NEW.next_run <= clock_timestamp() + interval '2 seconds'
       AND (TG_OP = 'INSERT' OR OLD.repeats = 0 OR OLD.next_run IS DISTINCT FROM NEW.next_run)
    THEN
        PERFORM pg_notify(
            'durable_agent_alarm',
            coalesce(NEW.cluster, '') || ' ' || extract(epoch FROM NEW.next_run)::text
        );
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS da_schedule_notify ON django_q_schedule;
CREATE TRIGGER da_schedule_notify
    AFTER INSERT OR UPDATE OF next_run, repeats ON django_q_schedule
    FOR EACH ROW EXECUTE FUNCTION da_schedule_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS da_schedule_notify ON django_q_schedule;
DROP FUNCTION IF EXISTS da_schedule_notify();
"""


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0008_retention_indexes"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
