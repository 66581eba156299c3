"""Things looked up by a name from the spec: algorithms, rollout engines, training backends, rewards.

``Registry(kind)`` is the one register/lookup they share (as verl's ``register_policy_loss``):
registering an equal value under a taken name again is a no-op, a different one raises; looking
up an unknown name raises ``ValueError`` listing the valid ones. It imports nothing but the
standard library, so light modules (``hacrl_core.spec``, the operator) may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Values of one ``kind`` (a word for messages: ``"reward"``, ``"rollout engine"``) by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._values: dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        """Add ``value`` under ``name`` and return it; ``ValueError`` if ``name`` holds a different value."""
        if name in self._values and self._values[name] != value:
            raise ValueError(f"{self.kind} {name!r} is already registered to {_describe(self._values[name])}")
        self._values[name] = value
        return value

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator(name)`` registers the decorated function or class under ``name``."""
        return lambda value: self.register(name, value)

    def get(self, name: str) -> T:
        try:
            return self._values[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def _describe(value: object) -> str:
    return getattr(value, "__qualname__", None) or repr(value)
