"""Confirmation pages for repair actions (like Django's delete confirmation, with a reason).

An action first renders a page listing its targets with a form (a reason, maybe a time);
posting it back with ``post=yes`` runs the service once per target and reports each result
with ``message_user``. Invalid input re-renders the page with the errors and changes nothing.
A ``next`` field brings the operator back to the page the action started from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.http import url_has_allowed_host_and_scheme

from durable_agent.errors import DurableAgentError
from durable_agent.text import error_text

logger = logging.getLogger("durable_agent.admin")

TEMPLATE = "admin/durable_agent/confirm_action.html"


@dataclass(frozen=True)
class Confirmation:
    """What a confirmation page says and does.

    ``run(obj, cleaned_data)`` calls the service for one target and returns the success
    message; a :class:`DurableAgentError` it raises becomes an error message for that target
    (the service wrote nothing).
    """

    action: str
    title: str
    button: str
    explanation: str
    run: Callable[[Any, dict[str, Any]], str]
    form_class: type[forms.Form]
    describe: Callable[[Any], str] = str
    catch_all: bool = False  # also report unexpected exceptions (a pass may raise anything)


def safe_next(request: HttpRequest) -> str | None:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return None


def _errors(form: forms.Form) -> str:
    parts = []
    for name, errors in form.errors.items():
        label = form.fields[name].label or name if name in form.fields else ""
        text = " ".join(str(error) for error in errors)
        parts.append(f"{label}: {text}" if label else text)
    return "; ".join(parts)


def confirm(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    confirmation: Confirmation,
) -> HttpResponse | None:
    """Render the confirmation page, or (on ``post=yes``) run the action on every target."""
    has_repair = getattr(modeladmin, "has_repair_permission", None)
    if has_repair is None or not has_repair(request):
        raise PermissionDenied  # unreachable through the changelist, which filters actions
    targets: Sequence[Model] = list(queryset)
    if request.POST.get("post") == "yes":
        form = confirmation.form_class(request.POST)
        if form.is_valid():
            for obj in targets:
                _run_one(modeladmin, request, confirmation, obj, form.cleaned_data)
            target = safe_next(request)
            return HttpResponseRedirect(target) if target else None
        modeladmin.message_user(
            request, f"Nothing was changed. {_errors(form)}", messages.ERROR, fail_silently=True
        )
    else:
        form = confirmation.form_class()
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": confirmation.title,
        "subtitle": None,
        "opts": opts,
        "confirmation": confirmation,
        "targets": [(obj, confirmation.describe(obj)) for obj in targets],
        "form": form,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "next": safe_next(request) or "",
        "media": modeladmin.media + form.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _run_one(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    confirmation: Confirmation,
    obj: Model,
    data: dict[str, Any],
) -> None:
    label = confirmation.describe(obj)
    try:
        message = confirmation.run(obj, data)
    except DurableAgentError as exc:
        modeladmin.message_user(request, f"{label}: {exc.message}", messages.ERROR)
    except Exception as exc:
        if not confirmation.catch_all:
            raise
        logger.exception("Admin action %s failed on %s", confirmation.action, label)
        modeladmin.message_user(
            request, f"{label}: failed with {error_text(exc, limit=2000)}", messages.ERROR
        )
    else:
        modeladmin.message_user(request, message, messages.SUCCESS)
