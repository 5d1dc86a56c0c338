"""The forms of the admin's confirmation pages: a required reason, and a time to rearm at."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.utils import timezone

from durable_agent import clock
from durable_agent.errors import InvalidInput
from durable_agent.text import MAX_REASON_LENGTH, validate_reason

REARM_PAST_LIMIT = timedelta(minutes=5)
"""How far in the past an operator may set the slot (a past slot fires at once)."""

DATETIME_INPUT_FORMAT = "%Y-%m-%dT%H:%M:%S"


class ReasonForm(forms.Form):
    """Every repair says why; the reason is kept in the audit row."""

    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Required. Kept in the audit trail with your user name.",
    )

    def clean_reason(self) -> str:
        try:
            return validate_reason(self.cleaned_data.get("reason", ""), required=True)
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message, code="reason") from exc


class RearmAtForm(ReasonForm):
    """An explicit slot time: aware, and not more than five minutes in the past."""

    at = forms.DateTimeField(
        label="Rearm at",
        input_formats=[DATETIME_INPUT_FORMAT, "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format=DATETIME_INPUT_FORMAT
        ),
        help_text=(
            "UTC; an ISO 8601 time with an offset (2030-01-01T09:30:00+02:00) is accepted too. "
            "At most 5 minutes in the past, and no later than work already due."
        ),
    )
    field_order = ["at", "reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            now = clock.now().replace(microsecond=0)
            self.initial.setdefault("at", timezone.localtime(now).replace(tzinfo=None))

    def clean_at(self) -> datetime:
        value: datetime | None = self.cleaned_data.get("at")
        if value is None:  # pragma: no cover - a required field never cleans to None
            raise forms.ValidationError("A time is required", code="required")
        if timezone.is_naive(value):  # pragma: no cover - DateTimeField makes it aware
            value = timezone.make_aware(value)
        earliest = clock.now() - REARM_PAST_LIMIT
        if value < earliest:
            raise forms.ValidationError(
                "%(at)s is more than 5 minutes in the past (the clock reads %(now)s); "
                "choose a later time, or use \u201crearm now\u201d to recompute the slot.",
                code="too_early",
                params={"at": value.isoformat(), "now": clock.now().isoformat()},
            )
        return value
