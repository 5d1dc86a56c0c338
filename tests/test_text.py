"""The storable-text rule (``durable_agent.text.storable``) and describing an error
(``durable_agent.errors.describe_error``): what every stored error text goes through."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DataError

from durable_agent.errors import describe_error, error_message, leaves, type_name
from durable_agent.text import error_text, storable, storable_json, unstorable


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class ExitingStr(Exception):
    def __str__(self) -> str:
        raise SystemExit("from __str__")


class Loud(str):
    def __format__(self, spec: str) -> str:
        raise RuntimeError("__format__ exploded")


class LoudStr(Exception):
    def __str__(self) -> str:
        return Loud("a str subclass")


class NamedBadly(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class Nameless(Exception, metaclass=NamedBadly):
    pass


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("bad\x00byte", "bad\ufffdbyte"),
        ("half a pair: \ud800", "half a pair: \ufffd"),
        ("a pair as two: \ud83d\ude00", "a pair as two: \ufffd\ufffd"),
        ("emoji \U0001f600 stays", "emoji \U0001f600 stays"),
    ],
)
def test_storable__replaces_what_no_database_stores(value: str, expected: str) -> None:
    assert storable(value, limit=100) == expected
    assert unstorable(storable(value, limit=100)) is None


def test_storable__cuts_to_the_limit_with_an_ellipsis() -> None:
    assert storable("x" * 10, limit=10) == "x" * 10
    assert storable("x" * 11, limit=10) == "x" * 9 + "\u2026"
    assert len(storable("\x00" * 5000, limit=2000)) == 2000


def test_storable__returns_a_plain_str() -> None:
    assert type(storable(Loud("text"), limit=10)) is str


def test_describe_error__an_unreadable_message_is_described_by_its_type() -> None:
    assert describe_error(BadStr()) == (
        "BadStr: (the message of this BadStr could not be read: RuntimeError)"
    )
    assert error_message(ExitingStr()) == (
        "(the message of this ExitingStr could not be read: SystemExit)"
    )
    assert type(error_message(LoudStr())) is str
    assert describe_error(LoudStr()) == "LoudStr: a str subclass"
    assert type_name(Nameless()) == "BaseException"
    assert describe_error(ValueError()) == "ValueError"


def test_describe_error__a_database_error_keeps_its_first_line() -> None:
    exc = DataError(
        'unsupported Unicode escape sequence\nLINE 1: ..."error" = E\'{"type":...\n'
        "DETAIL:  \\u0000 cannot be converted to text.\nCONTEXT:  JSON data, line 1: secret"
    )
    assert describe_error(exc) == "DataError: unsupported Unicode escape sequence"


def test_describe_error__a_group_lists_its_leaves() -> None:
    group = BaseExceptionGroup("two tasks", [ValueError("a"), BaseExceptionGroup("in", [BadStr()])])
    assert describe_error(group) == (
        "ExceptionGroup: two tasks (2 sub-exceptions): ValueError: a; ExceptionGroup: "
        "in (1 sub-exception): BadStr: (the message of this BadStr could not be read: "
        "RuntimeError)"
    )
    assert [type(leaf) for leaf in leaves(group)] == [ValueError, BadStr]
    many = ExceptionGroup("many", [ValueError(str(n)) for n in range(7)])
    assert describe_error(many).endswith("ValueError: 4; and 2 more")


def test_error_text__storable_and_bounded() -> None:
    assert error_text(ValueError("bad\x00byte"), limit=100) == "ValueError: bad\ufffdbyte"
    assert len(error_text(ValueError("x" * 5000), limit=50)) == 50


def test_storable_json__every_key_and_string() -> None:
    value: Any = {"a\x00": ["b\ud800", 1, None, {"c": "d\x00"}], "n": 2.5}
    assert storable_json(value) == {"a\ufffd": ["b\ufffd", 1, None, {"c": "d\ufffd"}], "n": 2.5}
