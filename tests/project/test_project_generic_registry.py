"""hacrl_core.registry.Registry: the register/lookup every named thing in the spec goes through."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from hacrl_core.registry import Registry


@dataclass(frozen=True)
class Entry:
    module: str


def test_lookup_and_names() -> None:
    registry: Registry[Entry] = Registry("widget")
    registry.register("b", Entry("x"))
    registry.register("a", Entry("y"))
    assert registry.get("a") == Entry("y")
    assert registry.names() == ["a", "b"]
    assert "a" in registry and "c" not in registry


def test_unknown_name_lists_the_valid_ones() -> None:
    registry: Registry[int] = Registry("rollout engine")
    registry.register("hf", 1)
    registry.register("vllm", 2)
    with pytest.raises(ValueError, match="^unknown rollout engine 'x'; valid rollout engines: hf, vllm$"):
        registry.get("x")


def test_registering_an_equal_value_again_is_a_no_op() -> None:
    registry: Registry[Entry] = Registry("widget")
    registry.register("a", Entry("m"))
    assert registry.register("a", Entry("m")) == Entry("m")
    assert registry.names() == ["a"]


def test_registering_a_different_value_under_a_taken_name_raises_and_keeps_the_first() -> None:
    registry: Registry[object] = Registry("reward")

    @registry.decorator("exact")
    def exact() -> None: ...

    def other() -> None: ...

    with pytest.raises(ValueError, match="reward 'exact' is already registered to .*exact"):
        registry.register("exact", other)
    assert registry.get("exact") is exact


def test_the_decorator_returns_what_it_decorates() -> None:
    registry: Registry[type] = Registry("backend")

    @registry.decorator("plain")
    class Plain: ...

    assert registry.get("plain") is Plain


def test_importing_it_loads_no_ml_library() -> None:
    code = (
        "import sys, hacrl_core.registry; print(sorted(m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_spec_offers_exactly_the_registered_names() -> None:
    """Rewards are derived from their registry; engines and backends are written once, in the
    catalog's tables, which the spec offers and their registries are filled from."""
    from typing import get_args

    from hacrl_core.catalog import BACKEND_TABLE, ENGINE_TABLE, installed_backends, installed_engines
    from hacrl_core.learner.backends import BACKENDS, OPTIONAL_BACKENDS, available_backends
    from hacrl_core.rewards import reward_names
    from hacrl_core.rollout.engine import ENGINES, available_engines
    from hacrl_core.spec import REWARD_NAMES, REWARD_PATTERN, LearnerSettings, RolloutSettings

    assert list(REWARD_NAMES) == reward_names()
    assert REWARD_PATTERN.startswith(
        "^(" + "|".join(reward_names()) + "|"
    )  # data.reward: a name, or a reward server's URL
    assert get_args(RolloutSettings.model_fields["engine"].annotation) == tuple(ENGINE_TABLE)
    assert all(ENGINES.get(name) is engine for name, engine in ENGINE_TABLE.items()) and ENGINES.names() == sorted(
        ENGINE_TABLE
    )
    assert get_args(LearnerSettings.model_fields["backend"].annotation) == tuple(BACKEND_TABLE)
    assert sorted(set(BACKENDS.names()) | set(OPTIONAL_BACKENDS)) == sorted(BACKEND_TABLE)
    # What a worker checks before it starts (the catalog, no engine or backend imported) is what the registries run.
    assert installed_engines() == available_engines() and installed_backends() == available_backends()
