from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import durable_agent
from durable_agent.agents import registry, services


def test_package__exposes_the_services_lazily() -> None:
    assert durable_agent.agent is registry.agent
    assert durable_agent.submit is services.submit
    assert durable_agent.abort is services.abort
    assert durable_agent.approve is services.approve
    assert durable_agent.resolve_unknown is services.resolve_unknown
    assert {"agent", "submit", "abort", "approve", "resolve_unknown"} <= set(dir(durable_agent))


def test_package__unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="nonexistent"):
        durable_agent.nonexistent  # noqa: B018


def test_package__import_and_decorate_touch_no_models_or_settings() -> None:
    code = (
        "import sys, durable_agent\n"
        "@durable_agent.agent('x')\n"
        "def x(ctx, payload): return payload\n"
        "assert not any(m.startswith('durable_agent.models') for m in sys.modules), sys.modules\n"
        "assert 'django.conf' not in sys.modules or not __import__('django.conf').conf.settings"
        ".configured\n"
        "print(durable_agent.__version__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == durable_agent.__version__


def test_agents_package__exposes_its_names_lazily() -> None:
    from durable_agent import agents
    from durable_agent.agents.runtime import ReferenceRuntime

    assert agents.ReferenceRuntime is ReferenceRuntime
    assert agents.MAX_PAYLOAD_BYTES == 256 * 1024
    assert set(agents.__all__) <= set(dir(agents))
    with pytest.raises(AttributeError, match="nope"):
        agents.nope  # noqa: B018
