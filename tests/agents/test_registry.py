from __future__ import annotations

import re
from typing import Any

import pytest

import durable_agent
from durable_agent.agents import registry
from durable_agent.agents.errors import AgentAlreadyRegistered
from durable_agent.agents.registry import AgentSpec
from durable_agent.errors import ConfigurationError, InvalidInput
from durable_agent.models import Submission


def first(ctx: Any, payload: Any) -> Any:
    return payload


def second(ctx: Any, payload: Any) -> Any:
    return None


def _definition() -> Any:
    def agent_fn(ctx: Any, payload: Any) -> Any:
        return payload

    return agent_fn


def test_agent__decorator_registers_and_returns_the_function() -> None:
    decorated = durable_agent.agent("summarise", version="2", retry_safe=True)(first)

    assert decorated is first
    assert registry.lookup("summarise", "2") == AgentSpec("summarise", "2", first, True)
    assert registry.lookup("summarise", "1") is None


def test_agent__defaults_to_version_1_and_not_retry_safe() -> None:
    durable_agent.agent("summarise")(first)

    spec = registry.lookup("summarise", "1")
    assert spec is not None
    assert spec.retry_safe is False


def test_register__int_version_becomes_a_string() -> None:
    registry.register("summarise", first, version=3)

    assert registry.versions("summarise") == ("3",)


@pytest.mark.parametrize(
    ("name", "version"),
    [("", "1"), ("x" * 101, "1"), (None, "1"), ("ok", ""), ("ok", "v" * 65), ("ok", True)],
)
def test_register__rejects_invalid_names_and_versions(name: Any, version: Any) -> None:
    with pytest.raises(InvalidInput):
        registry.register(name, first, version=version)
    assert registry.registered() == ()


def test_register__rejects_a_non_callable() -> None:
    with pytest.raises(InvalidInput, match="callable"):
        registry.register("summarise", "not a function")  # type: ignore[arg-type]


def test_register__same_function_twice_is_a_no_op() -> None:
    registry.register("summarise", first)
    registry.register("summarise", first)

    assert len(registry.registered()) == 1


def test_register__same_definition_reimported_replaces_quietly() -> None:
    old, new = _definition(), _definition()
    registry.register("summarise", old)
    registry.register("summarise", new)

    spec = registry.lookup("summarise", "1")
    assert spec is not None
    assert spec.fn is new


def test_register__another_function_under_the_same_binding_raises() -> None:
    registry.register("summarise", first)

    with pytest.raises(AgentAlreadyRegistered) as caught:
        registry.register("summarise", second)

    assert caught.value.code == "agent_already_registered"
    assert isinstance(caught.value, ConfigurationError)
    assert "bump the version" in str(caught.value)
    spec = registry.lookup("summarise", "1")
    assert spec is not None
    assert spec.fn is first


def test_register__changing_retry_safe_without_a_new_version_raises() -> None:
    registry.register("summarise", first, retry_safe=False)

    with pytest.raises(AgentAlreadyRegistered):
        registry.register("summarise", first, retry_safe=True)


def test_register__another_version_of_the_same_name_is_a_new_binding() -> None:
    registry.register("summarise", first, version="1")
    registry.register("summarise", second, version="2")

    assert registry.versions("summarise") == ("1", "2")


def test_registry_key__is_a_sha256_hex_digest() -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", registry.registry_key())


def test_registry_key__is_order_insensitive() -> None:
    registry.register("a", first)
    registry.register("b", second, version="7")
    forwards = registry.registry_key()
    registry.restore({})
    registry.register("b", second, version="7")
    registry.register("a", first)

    assert registry.registry_key() == forwards


def test_registry_key__depends_only_on_names_and_versions() -> None:
    registry.register("a", first)
    key = registry.registry_key()
    registry.restore({})
    registry.register("a", second, retry_safe=True)

    assert registry.registry_key() == key


def test_registry_key__changes_with_the_bindings() -> None:
    empty = registry.registry_key()
    registry.register("a", first)
    one = registry.registry_key()
    registry.register("a", second, version="2")

    assert len({empty, one, registry.registry_key()}) == 3


def test_registry_key__is_computed_once_until_the_bindings_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.register("a", first)
    before = registry.registry_key()
    digests: list[bytes] = []
    original = registry.hashlib.sha256

    def counted(data: bytes) -> Any:
        digests.append(data)
        return original(data)

    monkeypatch.setattr(registry.hashlib, "sha256", counted)
    assert [registry.registry_key() for _ in range(3)] == [before] * 3
    assert digests == []  # kept: nothing changed since it was computed

    registry.register("a", first)  # the same binding again changes nothing
    assert registry.registry_key() == before
    assert digests == []

    for change in (
        lambda: registry.register("b", second),
        lambda: registry.unregister("b", "1"),
        lambda: registry.restore({}),
    ):
        change()
        fresh = registry.registry_key()
        monkeypatch.setattr(registry.hashlib, "sha256", original)
        registry._key[0] = None
        assert fresh == registry.registry_key()  # what a computation from scratch gives
        monkeypatch.setattr(registry.hashlib, "sha256", counted)
    assert len(digests) == 3
    assert registry.registry_key() != before  # the bindings are empty now


def test_registry_key__pairs_cannot_collide_by_concatenation() -> None:
    registry.register("ab", first, version="1")
    joined = registry.registry_key()
    registry.restore({})
    registry.register("a", first, version="b1")

    assert registry.registry_key() != joined


def test_unregister__removes_one_binding() -> None:
    registry.register("a", first)

    assert registry.unregister("a", "1") is True
    assert registry.unregister("a", "1") is False
    assert registry.lookup("a", "1") is None


def test_snapshot__restore_brings_back_the_registrations() -> None:
    registry.register("a", first)
    saved = registry.snapshot()
    registry.register("b", second)
    registry.restore(saved)

    assert [spec.name for spec in registry.registered()] == ["a"]


def test_limits__match_the_submission_columns() -> None:
    assert Submission._meta.get_field("agent").max_length == registry.MAX_AGENT_NAME_LENGTH
    assert (
        Submission._meta.get_field("agent_version").max_length == registry.MAX_AGENT_VERSION_LENGTH
    )
