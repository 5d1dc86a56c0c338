from django.db import models


class Fact(models.Model):
    """A stand-in for a source fact (an inbox row, an outbox row...)."""

    host = models.ForeignKey("durable_agent.Host", on_delete=models.CASCADE)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"fact {self.pk}"


class Execution(models.Model):
    """One run of a soak agent (a submission may run more than once; it settles once)."""

    submission_id = models.BigIntegerField(db_index=True)
    attempt = models.IntegerField()
    os_pid = models.IntegerField(null=True)  # the worker process that ran it
    db_pid = models.IntegerField(null=True)  # the PostgreSQL backend of its connection
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"execution {self.submission_id}/{self.attempt}"
