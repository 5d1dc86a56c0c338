from django.db import models
from django.db.models.functions import Now


class Run(models.Model):
    """One execution of a timer's task: which system, which timer, when the task started.

    No unique constraint on purpose: a duplicate execution must be counted, not refused.
    """

    system = models.CharField(max_length=16)
    key = models.CharField(max_length=64)
    started = models.FloatField()  # time.time() when the task (handler) started
    at = models.DateTimeField(db_default=Now())  # when its row was written

    class Meta:
        indexes = [models.Index(fields=["system", "key"], name="peers_run_system_key")]

    def __str__(self) -> str:
        return f"{self.system} {self.key}"


class Write(models.Model):
    """The one row a producer's transaction writes in the commit scenario."""

    system = models.CharField(max_length=16)
    n = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.system} {self.n}"
