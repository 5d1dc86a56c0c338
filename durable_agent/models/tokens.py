"""API tokens: a name, a scope and the SHA-256 digest of a secret shown once."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact

MAX_TOKEN_NAME_LENGTH = 100


class ApiTokenScope(models.TextChoices):
    READ = "read", "read (GET endpoints only)"
    SUBMIT = "submit", "submit (submitting work; host GETs, not submissions)"
    REPAIR = "repair", "repair (every endpoint)"


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A bearer token of the HTTP API. Only the digest of its secret is stored.

    Audit rows written through the token name it ``token:<name>``. A revoked token is kept
    (its name and dates stay visible); its name is never given to a new token.
    """

    name = models.CharField(max_length=MAX_TOKEN_NAME_LENGTH)
    scope = models.CharField(max_length=8, choices=ApiTokenScope.choices)
    digest = models.CharField(max_length=64, unique=True, help_text="sha256 hex of the secret.")
    prefix = models.CharField(max_length=16, help_text="The secret's first characters.")
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(revoked_at__isnull=True),
                name="da_apitoken_one_active_per_name",
            ),
            models.CheckConstraint(
                condition=Q(scope__in=ApiTokenScope.values), name="da_apitoken_scope_valid"
            ),
            models.CheckConstraint(
                condition=Q(Exact(Length("digest"), 64)), name="da_apitoken_digest_length"
            ),
        ]

    def __str__(self) -> str:
        return f"token:{self.name}"

    @property
    def actor(self) -> str:
        """The actor name audit rows record for this token."""
        return f"token:{self.name}"

    @property
    def can_repair(self) -> bool:
        return self.scope == ApiTokenScope.REPAIR

    @property
    def can_submit(self) -> bool:
        """``submit`` and ``repair`` tokens may submit work (repair tokens always could)."""
        return self.scope in (ApiTokenScope.SUBMIT, ApiTokenScope.REPAIR)
