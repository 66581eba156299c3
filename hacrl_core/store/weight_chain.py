"""Weight publishes as chains: a full publish, then deltas against the previous publish.

docs/architecture.md, "Weight publishes". Every version is a committed directory
``weights/<agent>/<version:06d>/`` (``TrajectoryStore.publish_weights``) holding ``hacrl-weights.json``
(``META``) and either

- a **full** publish: the model directory (safetensors, config, tokenizer), and, when the learner
  had its previous publish at hand, also ``delta.safetensors`` against it, so that a reader that
  holds that previous version reads the delta only; or
- a **delta** publish: ``delta.safetensors`` alone (``weight_deltas``: the changed elements of each
  tensor), against the version named ``parent`` in its META.

META: ``{"format": 1, "kind": "full"|"delta", "version", "base" (the full publish the chain starts
from), "chain" (versions from base to this one), "parent", "parent_sha256", "state_sha256",
"full_bytes", "delta_bytes", "chain_bytes", "changed", "numel"}``. ``state_sha256`` is the checksum
of the whole state this version stands for (``weight_deltas.state_sha256``), checked by every
reader after every applied delta; ``parent_sha256`` ties a delta to the exact state it applies to,
so a chain mixed from two publishes of one version (a learner restarted between them) is caught
before a delta is applied to the wrong base.

A directory without META (a LoRA adapter, a store written before chains) is a plain publish:
``fetch_policy`` downloads it whole, as ``TrajectoryStore.fetch_weights`` does.

Rules:

- The learner (``publish_policy``) publishes a delta against the newest committed version below
  the new one, unless the chain since the last full publish already holds ``full_every - 1``
  deltas, or its deltas with this one would add up to more than one full publish, or this delta
  alone is more than half a full publish (an fp32 copy, nearly every element changed), or the previous
  version cannot be rebuilt and verified (a new pod rebuilds it from the store; a learner resumed
  after a kill too): then a full publish. So a reader never reads more than one full publish plus
  ``full_every - 1`` deltas, and never more than twice a full publish in all.
- A reader (``fetch_policy``) keeps the last version it rebuilt in its local directory and, for a
  new version, follows parent links back to the version it holds (steady state: one delta) or to
  the chain's full publish (new replica, restarted pod, ``hacrl eval``). A delta that is missing,
  corrupt (sha256 against its commit manifest), of another parent or whose result misses its
  checksum stops the chain there: the reader keeps the newest version it rebuilt and verified (at
  worst the full publish) and logs a warning naming it; ``Fetched.version`` says which version it
  holds, and rows sampled from it carry that version. The next full publish ends the fallback.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hacrl_core.store import layout
from hacrl_core.store.commit import get_dir, list_committed_dirs
from hacrl_core.store.errors import CorruptObject, StoreError
from hacrl_core.store.weight_deltas import DeltaMismatch, StateDelta, apply_delta, state_delta, state_sha256

log = logging.getLogger("hacrl")

META = "hacrl-weights.json"
DELTA = "delta.safetensors"
FORMAT = 1
#: The safetensors metadata key that holds the per-tensor encodings of a delta file.
DELTA_TENSORS = "hacrl.delta.tensors"
#: A delta larger than this fraction of a full publish is published in full instead (an fp32 copy,
#: whose elements nearly all change); a full publish carries the delta against its parent beside it
#: while the delta is below this fraction (beyond it a holder of the parent saves little).
DELTA_BESIDE_FULL = 0.5


@dataclass(frozen=True)
class WeightMeta:
    """A version's META (``hacrl-weights.json``), read once into typed fields; see the module
    docstring. ``parent`` and the fields after it are set when the version carries a delta against
    its parent (a delta publish, or a full one with its delta beside it); ``changed`` and ``numel``
    too, and ``delta_bytes`` only when the delta file was written."""

    kind: str  # "full" or "delta"
    version: int
    base: int
    chain: tuple[int, ...]
    state_sha256: str
    full_bytes: int
    chain_bytes: int
    format: int = FORMAT
    parent: int | None = None
    parent_sha256: str | None = None
    changed: int | None = None
    numel: int | None = None
    delta_bytes: int | None = None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> WeightMeta:
        """From the JSON object of a META file; KeyError, TypeError or ValueError if it is not one."""
        if not isinstance(value, dict):
            raise TypeError(f"a META is a JSON object, not {type(value).__name__}")
        optional = ("parent", "parent_sha256", "changed", "numel", "delta_bytes")
        return cls(
            kind=str(value["kind"]),
            version=int(value["version"]),
            base=int(value["base"]),
            chain=tuple(int(v) for v in value["chain"]),
            state_sha256=str(value["state_sha256"]),
            full_bytes=int(value["full_bytes"]),
            chain_bytes=int(value.get("chain_bytes", 0)),
            format=int(value.get("format", FORMAT)),
            **{key: value[key] for key in optional if value.get(key) is not None},
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the META file (fields that are None left out)."""
        out = {key: getattr(self, key) for key in self.__dataclass_fields__ if getattr(self, key) is not None}
        out["chain"] = list(self.chain)
        return out

    def holds(self, version: int | None, state_sha256: str | None) -> bool:
        """Whether this META stands for ``version`` with the state checksum ``state_sha256``."""
        return self.version == version and self.state_sha256 == state_sha256


class ChainBroken(StoreError):
    """A version of a weight chain cannot be rebuilt (missing, corrupt, or of another parent)."""


# -- local model directories ------------------------------------------------------------------


def _weight_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.safetensors") if p.name != DELTA)


def read_state(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a model directory's safetensors files, and the file each comes from."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    files: dict[str, str] = {}
    for path in _weight_files(directory):
        for name, tensor in load_file(str(path)).items():
            tensors[name] = tensor
            files[name] = path.name
    if not tensors:
        raise CorruptObject(f"{directory}: no safetensors weights to publish or update")
    return tensors, files


def write_state(directory: Path, tensors: dict[str, torch.Tensor], files: dict[str, str]) -> None:
    """Rewrite the directory's safetensors files with ``tensors`` (each file atomically)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for path in _weight_files(directory):
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata()
        part = {name: tensors[name].contiguous() for name, file in files.items() if file == path.name}
        staging = path.with_name(f".{path.name}.tmp")
        save_file(part, str(staging), metadata=metadata)
        os.replace(staging, path)


def read_local_meta(directory: Path) -> WeightMeta | None:
    """The META of the version a local directory holds (None: none, or unreadable)."""
    try:
        return WeightMeta.from_json(json.loads((directory / META).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_meta(path: Path, meta: WeightMeta) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(meta.to_json(), indent=1, sort_keys=True))
    os.replace(staging, path)


def directory_bytes(path: Path) -> int:
    """The bytes of every file under ``path``: what a publish of that folder writes."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _write_delta(path: Path, delta: StateDelta) -> int:
    from safetensors.torch import save_file

    flat, described = delta.to_flat()
    save_file({k: v.contiguous() for k, v in flat.items()}, str(path), metadata={DELTA_TENSORS: json.dumps(described)})
    return path.stat().st_size


def _read_delta(path: Path) -> StateDelta:
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), "pt") as handle:
            described = json.loads((handle.metadata() or {})[DELTA_TENSORS])
        return StateDelta.from_flat(load_file(str(path)), described)
    except (KeyError, ValueError, OSError) as error:
        raise DeltaMismatch(f"{path.name}: not a weight delta: {error}") from None


# -- the store side -----------------------------------------------------------------------------


def _prefix(store, agent: str, version: int) -> str:
    return layout.weights_prefix(store.experiment, agent, version)


def committed_versions(store, agent: str) -> list[int]:
    names = list_committed_dirs(store.objects, layout.weights_root(store.experiment, agent))
    return sorted(v for v in map(layout.parse_index, names) if v is not None)


def _files_bytes(manifest: dict[str, Any], wanted: Callable[[str], bool]) -> int:
    return sum(int(e.get("size", 0)) for e in manifest.get("files", []) if wanted(str(e.get("path"))))


def _download(store, agent: str, version: int, target: Path, wanted: Callable[[str], bool], wait: float) -> int:
    """The files of the version's directory that ``wanted`` names, into ``target``; bytes read."""
    manifest = get_dir(
        store.objects, _prefix(store, agent, version), target, wait=wait, skip=lambda path: not wanted(path)
    )
    return _files_bytes(manifest, wanted)


class _Reader:
    """One fetch: the METAs it read (each once) and the bytes it downloaded."""

    def __init__(self, store, agent: str, scratch: Path) -> None:
        self.store, self.agent, self.scratch = store, agent, scratch
        self.metas: dict[int, WeightMeta | None] = {}
        self.bytes_read = 0

    def meta(self, version: int, wait: float = 0.0) -> WeightMeta | None:
        """The version's META (None: a plain directory without one)."""
        if version not in self.metas:
            target = self.scratch / f"meta-{version:06d}"
            target.mkdir(parents=True, exist_ok=True)
            manifest = get_dir(
                self.store.objects,
                _prefix(self.store, self.agent, version),
                target,
                wait=wait,
                skip=lambda path: path != META,
            )
            self.bytes_read += _files_bytes(manifest, lambda path: path == META)
            listed = {str(e.get("path")) for e in manifest.get("files", [])}
            self.metas[version] = (
                WeightMeta.from_json(json.loads((target / META).read_text())) if META in listed else None
            )
        return self.metas[version]

    def delta(self, version: int) -> StateDelta:
        target = self.scratch / f"delta-{version:06d}"
        target.mkdir(parents=True, exist_ok=True)
        self.bytes_read += _download(self.store, self.agent, version, target, lambda path: path == DELTA, 0.0)
        return _read_delta(target / DELTA)


@dataclass(frozen=True)
class Fetched:
    """What ``fetch_policy`` left in its directory: ``version`` (the one asked for, or after a
    fallback an older one of its chain), ``bytes_read`` from the store, the deltas applied."""

    version: int
    requested: int
    bytes_read: int
    deltas_applied: int
    full_read: bool
    plain: bool = False

    @property
    def fell_back(self) -> bool:
        return self.version != self.requested


def _plan(reader: _Reader, version: int, held: WeightMeta | None) -> tuple[int | None, list[int]]:
    """(start, deltas): start None to use the held version, else the full publish to download;
    then the versions whose deltas take the state from there to ``version``, oldest first."""
    path: list[int] = []
    current = version
    meta = reader.meta(version)
    if meta is None:
        raise ChainBroken(f"version {version} is a plain directory")
    for _ in range(len(meta.chain) + 1):
        if held is not None and held.holds(current, meta.state_sha256):
            return None, path[::-1]
        holds_parent = held is not None and held.holds(meta.parent, meta.parent_sha256)
        if meta.kind == "full" and not (holds_parent and meta.delta_bytes):
            return current, path[::-1]
        if meta.parent is None:
            raise ChainBroken(f"version {current} in the chain of version {version} is a delta without a parent")
        path.append(current)
        current = meta.parent
        parent = reader.meta(current)
        if parent is None:
            raise ChainBroken(f"version {current} in the chain of version {version} is a plain directory")
        meta = parent
    raise ChainBroken(f"the chain of version {version} is longer than its META says ({list(meta.chain)})")


def fetch_policy(store, agent: str, version: int, local_dir: Path | str, *, wait: float = 0.0) -> Fetched:
    """Weights ``version`` of ``agent`` rebuilt in ``local_dir`` (a model directory ``engine.load``
    takes), starting from what ``local_dir`` already holds; see the module docstring for the fallback."""
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=local.parent) as scratch:
        reader = _Reader(store, agent, Path(scratch))
        what = f"weights version {version} of agent {agent!r}"
        try:
            meta = reader.meta(version, wait=wait)
        except TimeoutError as error:
            raise TimeoutError(f"experiment {store.experiment!r}: {what}: {error}") from None
        if meta is None:  # a plain directory: whole, as published
            shutil.rmtree(local)
            local.mkdir()
            read = _download(store, agent, version, local, lambda path: True, 0.0)
            return Fetched(version, version, reader.bytes_read + read, 0, True, plain=True)
        held = read_local_meta(local)
        try:
            start, deltas = _plan(reader, version, held)
        except (StoreError, TimeoutError, DeltaMismatch, KeyError, ValueError, TypeError) as error:
            log.warning(
                "%s: its chain cannot be followed (%s); falling back to its full publish %s",
                what,
                error,
                meta.base,
            )
            start, deltas = meta.base, []
        full_read = start is not None
        if start is not None:
            _replace_with_full(reader, start, local)
            held = read_local_meta(local)
        assert held is not None
        tensors, files = read_state(local) if deltas else ({}, {})
        applied = 0
        for step in deltas:
            step_meta = reader.meta(step)
            try:
                if step_meta is None or not held.holds(step_meta.parent, step_meta.parent_sha256):
                    raise DeltaMismatch(
                        f"it applies to version {step_meta and step_meta.parent}, not to the held version {held.version}"
                    )
                updated = apply_delta(tensors, reader.delta(step))
                got = state_sha256(updated)
                if got != step_meta.state_sha256:
                    raise DeltaMismatch(
                        f"the rebuilt state has sha256 {got}, its publish says {step_meta.state_sha256}"
                    )
            except (StoreError, TimeoutError, DeltaMismatch, KeyError) as error:
                log.warning(
                    "%s: the delta of version %d is unusable (%s); using version %d, the newest one rebuilt and "
                    "verified, until the next full publish",
                    what,
                    step,
                    error,
                    held.version,
                )
                break
            tensors, held, applied = updated, step_meta, applied + 1
        if applied:
            (local / META).unlink(missing_ok=True)  # no claim while the files change
            write_state(local, tensors, files)
            _write_meta(local / META, held)
        return Fetched(held.version, version, reader.bytes_read, applied, full_read)


def _replace_with_full(reader: _Reader, version: int, local: Path) -> None:
    """``local`` := the full publish ``version`` (without its delta), verified against its checksum."""
    meta = reader.meta(version)
    if meta is None or meta.kind != "full":
        raise ChainBroken(f"version {version} is not a full publish")
    (local / META).unlink(missing_ok=True)
    for path in _weight_files(local):
        path.unlink()
    reader.bytes_read += _download(reader.store, reader.agent, version, local, lambda path: path != DELTA, 0.0)
    tensors, _ = read_state(local)
    got = state_sha256(tensors)
    if got != meta.state_sha256:
        (local / META).unlink(missing_ok=True)
        raise CorruptObject(
            f"full weights version {version}: state sha256 {got} differs from its publish's {meta.state_sha256}"
        )


# -- the learner side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    version: int
    kind: str  # "full" or "delta"
    bytes_written: int
    full_bytes: int
    changed_fraction: float | None  # against the parent; None without one


def _reference(
    store, agent: str, parent: int, parent_meta: WeightMeta, reference_dir: Path
) -> dict[str, torch.Tensor] | None:
    """The state of version ``parent`` (from ``reference_dir`` or rebuilt there from the store), or None."""
    held = read_local_meta(reference_dir)
    if held is None or not held.holds(parent, parent_meta.state_sha256):
        try:
            fetched = fetch_policy(store, agent, parent, reference_dir)
        except (StoreError, TimeoutError, DeltaMismatch, OSError) as error:
            log.warning(
                "weights of agent %r: version %d cannot be rebuilt (%s); publishing in full", agent, parent, error
            )
            return None
        if fetched.version != parent:
            return None
    return read_state(reference_dir)[0]


def _new_meta(
    version: int,
    sha: str,
    full_bytes: int,
    parent: int | None,
    parent_meta: WeightMeta | None,
    delta: StateDelta | None,
    full_every: int,
) -> tuple[WeightMeta, bool]:
    """The META of a new publish (a delta where the module docstring's rules allow, else full) and
    whether its directory carries ``delta`` (a delta publish's, or a full one's beside it)."""
    if delta is None or parent is None or parent_meta is None:
        return WeightMeta("full", version, version, (version,), sha, full_bytes, 0), False
    chain_bytes = parent_meta.chain_bytes + delta.nbytes
    as_delta = (
        len(parent_meta.chain) < full_every
        and chain_bytes <= full_bytes
        and delta.nbytes <= DELTA_BESIDE_FULL * full_bytes
    )
    write_delta = as_delta or delta.nbytes < DELTA_BESIDE_FULL * full_bytes
    if as_delta:
        meta = WeightMeta(
            "delta", version, parent_meta.base, (*parent_meta.chain, version), sha, full_bytes, chain_bytes
        )
    else:
        meta = WeightMeta("full", version, version, (version,), sha, full_bytes, 0)
    meta = replace(
        meta,
        parent=parent,
        parent_sha256=parent_meta.state_sha256,
        changed=delta.changed,
        numel=delta.numel,
        delta_bytes=delta.nbytes if write_delta else None,
    )
    return meta, write_delta


def publish_policy(
    store, agent: str, version: int, local_dir: Path | str, reference_dir: Path | str, *, full_every: int
) -> Published:
    """Publish the model directory ``local_dir`` as weights ``version``: a delta against the newest
    committed version below it where the rules of the module docstring allow, else in full.
    ``local_dir`` then becomes ``reference_dir`` (the next publish's parent); ``full_every`` 1 is
    always full."""
    local, reference_dir = Path(local_dir), Path(reference_dir)
    tensors, _ = read_state(local)
    sha = state_sha256(tensors)
    full_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    earlier = [v for v in committed_versions(store, agent) if v < version]
    parent = earlier[-1] if earlier else None
    parent_meta: WeightMeta | None = None
    if parent is not None and full_every > 1:
        try:
            parent_meta = get_meta(store, agent, parent)
        except (StoreError, TimeoutError, ValueError) as error:
            log.warning(
                "weights of agent %r: META of version %d unreadable (%s); publishing in full", agent, parent, error
            )
    delta = None
    if parent is not None and parent_meta is not None:
        previous = _reference(store, agent, parent, parent_meta, reference_dir)
        if previous is not None:
            try:
                delta = state_delta(previous, tensors)
            except DeltaMismatch as error:
                log.info("weights of agent %r version %d: %s; publishing in full", agent, version, error)
    meta, write_delta = _new_meta(version, sha, full_bytes, parent, parent_meta, delta, full_every)
    as_delta = meta.kind == "delta"
    with tempfile.TemporaryDirectory(prefix=".publish-", dir=local.parent) as scratch:
        out = Path(scratch) if as_delta else local
        if delta is not None and write_delta:
            _write_delta(out / DELTA, delta)
        _write_meta(out / META, meta)
        written = directory_bytes(out)
        store.publish_weights(agent, version, out)
        (local / DELTA).unlink(missing_ok=True)
        _write_meta(local / META, meta)
    shutil.rmtree(reference_dir, ignore_errors=True)
    reference_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(local, reference_dir)
    fraction = delta.changed_fraction() if delta is not None else None
    return Published(version, meta.kind, written, full_bytes, fraction)


def get_meta(store, agent: str, version: int, *, wait: float = 0.0) -> WeightMeta | None:
    """The META of a committed weights version (None for a plain directory)."""
    with tempfile.TemporaryDirectory(prefix="hacrl-meta-") as scratch:
        return _Reader(store, agent, Path(scratch)).meta(version, wait=wait)
