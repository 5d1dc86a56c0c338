from django.db import models


class Fact(models.Model):
    """A stand-in for a source fact (an inbox row, an outbox row...)."""

    host = models.ForeignKey("durable_agent.Host", on_delete=models.CASCADE)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"fact {self.pk}"
