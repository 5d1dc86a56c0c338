"""The app that registers the hostile cases in the hostile suite's live cluster."""

from __future__ import annotations

from django.apps import AppConfig


class HostileCasesConfig(AppConfig):
    name = "tests.hostile"
    label = "hostile_cases"

    def ready(self) -> None:
        from tests.hostile import cases  # deferred: the cases import models

        cases.register()
