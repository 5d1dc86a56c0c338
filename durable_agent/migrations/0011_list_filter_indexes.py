"""Partial indexes behind the host lists' filters (Note [Host filters at scale] in
``durable_agent/maintenance/selectors.py``): each holds only the rows that make a host match
(a dirty state row, a parked lane, a failed pass, a single-thread host), so a filter over a
million hosts reads a handful of index entries. Building them reads each table once and
blocks its writes meanwhile (a few seconds at a million hosts).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_q', '0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more'),
        ('durable_agent', '0010_commit_intent_function'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='duelane',
            index=models.Index(condition=models.Q(('state', 'parked')), fields=['host'], name='da_duelane_parked'),
        ),
        migrations.AddIndex(
            model_name='host',
            index=models.Index(condition=models.Q(('single_thread', True)), fields=['key'], name='da_host_single_thread'),
        ),
        migrations.AddIndex(
            model_name='maintenancestate',
            index=models.Index(condition=models.Q(('dirty__gt', models.F('processed'))), fields=['host'], name='da_state_dirty'),
        ),
        migrations.AddIndex(
            model_name='passrecord',
            index=models.Index(condition=models.Q(('phase', 'failed')), fields=['host', '-started_at'], name='da_pass_failed'),
        ),
    ]
