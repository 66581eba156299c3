"""Delta between two versions of a model's tensors: the changed elements only, applied bit for bit.

Pure functions on tensors (no store, no files): docs/architecture.md, "Weight publishes". A
tensor's delta holds the elements whose *bits* differ (compared as integers of the same width, so
``-0.0`` vs ``0.0`` and NaN payloads count as changes and a round trip is bit-identical whatever
the dtype), in the smallest of three encodings:

- ``gaps``: the distance from each changed element to the previous one, one byte each (a gap
  over 255 takes a zero byte per 255 more: ``encode_gaps``), and the new values: about
  1 + itemsize bytes per changed element, the best while up to about 1 in 5 change (bf16);
- ``index``: the flat positions of the changed elements (int32, int64 past 2^31 elements) and
  their new values: 4 + itemsize bytes per changed element, for very sparse changes with long gaps;
- ``mask``: one bit per element (``numpy.packbits`` of the changed mask) and the new values:
  numel / 8 + itemsize bytes per changed element, the best from about 1 in 5 elements changed;
- ``dense``: the whole new tensor, when more than about 15/16 of it changed.

An unchanged tensor has no entry. The delta of a state is a flat ``{key: tensor}`` dict with keys
``<tensor name>/gaps|index|mask|values`` (safetensors-ready: no pickle) plus the per-tensor encodings,
shapes and dtypes, which ``apply_delta`` checks against the base before it writes anything.

``state_sha256`` is the checksum a publish carries beside it: sha256 over the tensors in name
order (name, dtype, shape, raw bytes), so two states with equal checksums are bit-identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

ENCODINGS = ("gaps", "index", "mask", "dense")
#: A gap byte of 0 advances this far without marking a position (``encode_gaps``).
GAP_STEP = 255
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DeltaMismatch(ValueError):
    """A delta does not fit the state it is applied to (names, shapes, dtypes or its checksum)."""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width, flat: equal bits, equal integers."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    width = flat.element_size()
    if width not in _INT_OF_WIDTH or flat.is_complex():
        raise TypeError(f"dtype {tensor.dtype} is not supported by weight deltas")
    return flat.view(_INT_OF_WIDTH[width])


def _raw(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy uint8 array (no copy for a contiguous CPU tensor)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorDelta:
    """One tensor's change: ``encoding`` and the tensors that carry it (``positions`` holds the
    int positions for ``index``, the packed bit mask for ``mask``, nothing for ``dense``)."""

    encoding: str
    values: torch.Tensor
    positions: torch.Tensor | None
    changed: int
    numel: int

    @property
    def nbytes(self) -> int:
        extra = 0 if self.positions is None else self.positions.numel() * self.positions.element_size()
        return self.values.numel() * self.values.element_size() + extra


def encode_gaps(positions: torch.Tensor) -> torch.Tensor:
    """Strictly increasing positions as uint8 gaps: a gap g >= 1 (from the previous position, the
    first from -1) is (g - 1) // 255 zero bytes, each advancing 255, then the byte g - 255 k."""
    gaps = torch.diff(positions.long(), prepend=torch.tensor([-1]))
    extra = (gaps - 1) // GAP_STEP
    ends = torch.cumsum(extra + 1, 0) - 1
    out = torch.zeros(int(ends[-1]) + 1 if ends.numel() else 0, dtype=torch.uint8)
    out[ends] = (gaps - GAP_STEP * extra).to(torch.uint8)
    return out


def decode_gaps(encoded: torch.Tensor) -> torch.Tensor:
    """The positions ``encode_gaps`` encoded (int64)."""
    steps = encoded.long()
    advance = torch.where(steps == 0, GAP_STEP, steps)
    return (torch.cumsum(advance, 0) - 1)[steps != 0]


def _gap_bytes(positions: torch.Tensor) -> int:
    gaps = torch.diff(positions, prepend=torch.tensor([-1]))
    return int(((gaps - 1) // GAP_STEP + 1).sum())


def _choose(changed: int, numel: int, itemsize: int, gap_bytes: int) -> str:
    gaps = gap_bytes + changed * itemsize
    index_bytes = changed * (itemsize + (4 if numel < 2**31 else 8))
    mask_bytes = (numel + 7) // 8 + changed * itemsize
    dense_bytes = numel * itemsize
    return min((gaps, "gaps"), (index_bytes, "index"), (mask_bytes, "mask"), (dense_bytes, "dense"))[1]


def tensor_delta(old: torch.Tensor, new: torch.Tensor) -> TensorDelta | None:
    """The change from ``old`` to ``new`` (same shape and dtype), or None when their bits are equal."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise DeltaMismatch(f"shape/dtype changed: {tuple(old.shape)} {old.dtype} -> {tuple(new.shape)} {new.dtype}")
    old_bits, new_bits = _bits(old.cpu()), _bits(new.cpu())
    differs = old_bits != new_bits
    changed = int(differs.sum())
    if changed == 0:
        return None
    numel = new_bits.numel()
    flat_new = new.detach().cpu().contiguous().reshape(-1)
    where = torch.nonzero(differs, as_tuple=True)[0]
    encoding = _choose(changed, numel, flat_new.element_size(), _gap_bytes(where))
    if encoding == "dense":
        return TensorDelta("dense", flat_new.clone(), None, changed, numel)
    if encoding == "gaps":
        return TensorDelta("gaps", flat_new[where].clone(), encode_gaps(where), changed, numel)
    if encoding == "index":
        positions = where.to(torch.int32 if numel < 2**31 else torch.int64)
        return TensorDelta("index", flat_new[where].clone(), positions, changed, numel)
    mask = torch.from_numpy(np.packbits(differs.numpy()))
    return TensorDelta("mask", flat_new[differs].clone(), mask, changed, numel)


def apply_tensor_delta(old: torch.Tensor, delta: TensorDelta) -> torch.Tensor:
    """``old`` with ``delta``'s elements written in; a new tensor, bit-identical to the one encoded."""
    if delta.numel != old.numel() or delta.values.dtype != old.dtype:
        raise DeltaMismatch(
            f"delta of {delta.numel} {delta.values.dtype} elements does not fit a tensor of {old.numel()} {old.dtype}"
        )
    if delta.encoding == "dense":
        if delta.values.numel() != old.numel():
            raise DeltaMismatch(f"dense delta holds {delta.values.numel()} elements for a tensor of {old.numel()}")
        return delta.values.reshape(old.shape).clone()
    flat = _bits(old.cpu()).clone()
    values = _bits(delta.values)
    if delta.encoding in ("index", "gaps"):
        assert delta.positions is not None
        where = delta.positions.long() if delta.encoding == "index" else decode_gaps(delta.positions)
        if where.numel() != values.numel() or (
            where.numel() and (int(where.min()) < 0 or int(where.max()) >= flat.numel())
        ):
            raise DeltaMismatch(
                f"{delta.encoding} delta: {where.numel()} positions for {values.numel()} values in a tensor of {flat.numel()}"
            )
    elif delta.encoding == "mask":
        assert delta.positions is not None
        where = torch.from_numpy(np.unpackbits(delta.positions.numpy(), count=flat.numel()).astype(bool))
        if int(where.sum()) != values.numel():
            raise DeltaMismatch(f"mask delta: {int(where.sum())} positions for {values.numel()} values")
    else:
        raise DeltaMismatch(f"unknown delta encoding {delta.encoding!r}; known: {', '.join(ENCODINGS)}")
    flat[where] = values
    return flat.view(old.dtype).reshape(old.shape)


@dataclass
class StateDelta:
    """The change between two states of the same tensor names, shapes and dtypes."""

    tensors: dict[str, TensorDelta] = field(default_factory=dict)
    numel: int = 0  # elements in the whole state
    full_bytes: int = 0  # bytes of the whole new state's tensors

    @property
    def changed(self) -> int:
        return sum(d.changed for d in self.tensors.values())

    @property
    def nbytes(self) -> int:
        return sum(d.nbytes for d in self.tensors.values())

    def changed_fraction(self) -> float:
        return self.changed / self.numel if self.numel else 0.0

    def to_flat(self) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
        """``({key: tensor}, {name: {encoding, changed, numel}})``: what a safetensors file and
        its JSON description hold (``from_flat`` reverses it)."""
        flat: dict[str, torch.Tensor] = {}
        described: dict[str, dict] = {}
        for name, delta in self.tensors.items():
            flat[f"{name}/values"] = delta.values
            if delta.positions is not None:
                flat[f"{name}/{delta.encoding}"] = delta.positions
            described[name] = {"encoding": delta.encoding, "changed": delta.changed, "numel": delta.numel}
        return flat, described

    @classmethod
    def from_flat(cls, flat: Mapping[str, torch.Tensor], described: Mapping[str, Mapping]) -> StateDelta:
        tensors = {}
        for name, entry in described.items():
            encoding = str(entry.get("encoding"))
            if encoding not in ENCODINGS:
                raise DeltaMismatch(f"tensor {name!r}: unknown delta encoding {encoding!r}")
            try:
                values = flat[f"{name}/values"]
                positions = None if encoding == "dense" else flat[f"{name}/{encoding}"]
            except KeyError as missing:
                raise DeltaMismatch(f"tensor {name!r}: the delta lacks {missing.args[0]!r}") from None
            tensors[name] = TensorDelta(encoding, values, positions, int(entry["changed"]), int(entry["numel"]))
        return cls(tensors)


def state_delta(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> StateDelta:
    """The delta from state ``old`` to ``new``; DeltaMismatch if their names, shapes or dtypes differ."""
    if set(old) != set(new):
        added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        raise DeltaMismatch(f"tensor names changed: added {added[:5]}, removed {removed[:5]}")
    delta = StateDelta()
    for name in sorted(new):
        try:
            change = tensor_delta(old[name], new[name])
        except DeltaMismatch as error:
            raise DeltaMismatch(f"tensor {name!r}: {error}") from None
        delta.numel += new[name].numel()
        delta.full_bytes += new[name].numel() * new[name].element_size()
        if change is not None:
            delta.tensors[name] = change
    return delta


def apply_delta(state: Mapping[str, torch.Tensor], delta: StateDelta) -> dict[str, torch.Tensor]:
    """``state`` with ``delta`` applied (a new dict; tensors without a change are shared)."""
    unknown = sorted(set(delta.tensors) - set(state))
    if unknown:
        raise DeltaMismatch(f"the delta changes tensors the state lacks: {unknown[:5]}")
    result = dict(state)
    for name, change in delta.tensors.items():
        try:
            result[name] = apply_tensor_delta(state[name], change)
        except DeltaMismatch as error:
            raise DeltaMismatch(f"tensor {name!r}: {error}") from None
    return result


def update_sha256(sha: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    """Feed one tensor into a state checksum (callers go in name order: ``state_sha256``)."""
    header = f"{name}\0{dtype_name(tensor.dtype)}\0{','.join(map(str, tensor.shape))}\0{tensor.numel()}\0"
    sha.update(header.encode())
    sha.update(_raw(tensor).data)


def state_sha256(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """The checksum of a state: sha256 of every tensor (name, dtype, shape, bytes) in name order."""
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    sha = hashlib.sha256()
    for name, tensor in sorted(items, key=lambda item: item[0]):
        update_sha256(sha, name, tensor)
    return sha.hexdigest()
