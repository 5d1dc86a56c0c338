"""What every durable_agent admin shares: read-only pages and the repair permission."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db.models import DateTimeField, Model
from django.http import HttpRequest

from durable_agent.admin import formatting as fmt

REPAIR_PERMISSION = "durable_agent.repair_host"
VIEW_HOST_PERMISSION = "durable_agent.view_host"

_M = TypeVar("_M", bound=Model)

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[_M]
else:

    class _Base(admin.ModelAdmin):
        """``admin.ModelAdmin`` is not subscriptable at run time: ``_Base[Host]`` (and every
        subclass subscripted the same way) is the class itself; only mypy sees the type."""

        def __class_getitem__(cls, item: Any) -> type:
            return cls


class ReadOnlyAdmin(_Base[_M]):
    """Nothing is added, edited or deleted here; repairs are actions that call services.

    Actions declared with ``permissions=["repair"]`` need ``durable_agent.repair_host``.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_repair_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(REPAIR_PERMISSION))

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        """Datetime columns in the host page's format (``2030-01-01 00:00:05 UTC``), not the
        locale's: one date format across the admin."""
        return [_utc_column(self.model, name) for name in super().get_list_display(request)]


@functools.cache
def _utc_column(model: type[Model], name: Any) -> Any:
    """The column of ``name``, the same object on every call: Django's default
    ``sortable_by`` is a second ``get_list_display()``, and a column sorts only if it is in
    it (a new function each call would leave every datetime column unsortable, its sort
    arrow never shown)."""
    if not isinstance(name, str):
        return name
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return name
    if not isinstance(field, DateTimeField):
        return name

    def column(obj: Any) -> str:
        value = getattr(obj, name)
        return fmt.timestamp(value) if value is not None else "-"

    shown: Callable[[Any], str] = admin.display(description=str(field.verbose_name), ordering=name)(
        column
    )
    shown.__name__ = name  # keeps the column's CSS classes (column-<name>, field-<name>)
    return shown


class HostPartAdmin(ReadOnlyAdmin[_M]):
    """A host's maintenance rows (lanes, retries, faults, audits, passes): whoever may view
    hosts may view them, as on the host page itself. They hold no payloads."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or bool(
            request.user.has_perm(VIEW_HOST_PERMISSION)
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or bool(
            request.user.has_perm(VIEW_HOST_PERMISSION)
        )
