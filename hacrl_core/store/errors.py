"""Errors raised by the trajectory store, shared by every backend."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error this package raises on purpose."""


class ObjectNotFound(StoreError):
    """The key does not exist (or is not a plain object)."""

    def __init__(self, key: str, where: str = "") -> None:
        self.key = key
        suffix = f" in {where}" if where else ""
        super().__init__(f"object {key!r} not found{suffix}")


class StoreUnavailable(StoreError):
    """The store cannot be used at all: endpoint unreachable, bucket missing, access denied.

    The message names the endpoint and bucket and says what to fix; it never contains a secret.
    """


class CorruptObject(StoreError):
    """An object's bytes do not match the size/sha256 recorded in its commit marker or manifest."""


class StoreGone(StoreError):
    """The store, or an experiment's data in it, was deleted while it was in use: nothing more may
    be written (a write would re-create it piecemeal)."""
