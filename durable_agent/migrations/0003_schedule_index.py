"""A partial index on django-q's Schedule table: armed slots by next_run.

django-q's scheduler scans ``repeats <> 0 AND next_run < now``; so does the fast-path probe.
Without this index both are sequential scans whose cost grows with every armed host; with it
they read only the due rows.
"""

from django.db import migrations

CREATE = (
    "CREATE INDEX IF NOT EXISTS da_schedule_armed_next_run "
    "ON django_q_schedule (next_run) WHERE NOT (repeats = 0)"
)
DROP = "DROP INDEX IF EXISTS da_schedule_armed_next_run"


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agent", "0002_ledger"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP)]
