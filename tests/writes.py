"""What a refused request or service call must leave as it was."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django_q.models import Schedule

from durable_agent.models import DueLane, Host, MaintenanceState, Submission


def footprint() -> dict[str, Any]:
    """Row counts of every durable_agent and django_q model, each host's generations, lanes and
    slot, and each submission's state. (An API token's ``last_used_at`` may change.)"""
    counts = {
        model._meta.label: model._default_manager.count()
        for label in ("durable_agent", "django_q")
        for model in apps.get_app_config(label).get_models()
    }
    return {
        "counts": counts,
        "generations": sorted(
            MaintenanceState.objects.values_list("host_id", "dirty", "processed", "nonterminal")
        ),
        "lanes": sorted(
            DueLane.objects.values_list("host_id", "lane", "revision", "due_at", "stalls"),
            key=repr,
        ),
        "slots": sorted(Host.objects.values_list("key", "alarm_id")),
        "schedules": sorted(Schedule.objects.values_list("pk", "next_run", "repeats")),
        "submissions": sorted(
            Submission.objects.values_list(
                "pk", "state", "outcome", "attempts", "abort_requested_at", "updated_at"
            )
        ),
    }
