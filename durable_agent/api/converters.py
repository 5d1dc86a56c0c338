"""URL converters of the API's paths."""

from __future__ import annotations

from django.urls import register_converter
from django.urls.converters import get_converters

THREAD = "durable_agent_thread"


class ThreadKeyConverter:
    """A thread key in a URL: any characters, "/" and line breaks included (Django's ``path``
    converter stops at a line break)."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


if THREAD not in get_converters():
    register_converter(ThreadKeyConverter, THREAD)
