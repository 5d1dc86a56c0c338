"""Indexes behind the admin's submission list (Note [The submission list at scale] in
``durable_agent/admin/submission_list.py``) and the retention of settled submissions: the
list's ordering (``-updated_at, -id``), the idempotency-key and thread-key searches, and the
settled submissions by age. Building them reads each table once and blocks its writes
meanwhile (a few seconds at a million submissions). Since ``updated_at`` is indexed, a
write that changes it (a transition, a lease renewal) also writes the table's index entries
(no heap-only update): the price of a list that reads the most recent work first.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durable_agent', '0013_submission_not_before'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='submission',
            index=models.Index(fields=['-updated_at', '-id'], name='da_submission_updated'),
        ),
        migrations.AddIndex(
            model_name='submission',
            index=models.Index(fields=['idempotency_key'], name='da_submission_idempotency'),
        ),
        migrations.AddIndex(
            model_name='submission',
            index=models.Index(condition=models.Q(('state', 'settled')), fields=['settled_at'], name='da_submission_settled'),
        ),
        migrations.AddIndex(
            model_name='thread',
            index=models.Index(fields=['key'], name='da_thread_key'),
        ),
    ]
