"""Weight deltas (hacrl_core/store/weight_deltas.py): every applied delta is bit-identical to the
state it was made from, in every encoding and dtype, and a delta that does not fit is refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_core.store.weight_deltas import (
    DeltaMismatch,
    StateDelta,
    apply_delta,
    apply_tensor_delta,
    decode_gaps,
    encode_gaps,
    state_delta,
    state_sha256,
    tensor_delta,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool]


def changed_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ, counted one element at a time."""
    return sum(
        state_sha256({"x": x}) != state_sha256({"x": y}) for x, y in zip(a.reshape(-1), b.reshape(-1), strict=True)
    )


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and state_sha256({"t": a}) == state_sha256({"t": b})


@st.composite
def tensor_pairs(draw):
    """(old, new): a random tensor and a copy with a random fraction of its elements rewritten,
    special values (NaN, -0.0, inf) included."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    if dtype.is_floating_point:
        old = torch.randn(shape, generator=generator).to(dtype)
    elif dtype == torch.bool:
        old = torch.rand(shape, generator=generator) > 0.5
    else:
        old = torch.randint(0, 100, shape, generator=generator).to(dtype)
    new = old.clone()
    fraction = draw(st.sampled_from([0.0, 0.01, 0.2, 0.5, 1.0]))
    flat = new.reshape(-1)
    for position in torch.randperm(numel, generator=generator)[: int(round(fraction * numel))].tolist():
        if dtype.is_floating_point:
            flat[position] = (
                draw(st.sampled_from([float("nan"), -0.0, float("inf"), 1e-3, -7.5]))
                if draw(st.booleans())
                else flat[position] + 1
            )
        elif dtype == torch.bool:
            flat[position] = ~flat[position]
        else:
            flat[position] = (flat[position] + 1) % 100
    return old, new


@settings(max_examples=300, deadline=None)
@given(tensor_pairs())
def test_applied_tensor_delta_is_bit_identical(pair) -> None:
    old, new = pair
    delta = tensor_delta(old, new)
    if delta is None:
        assert bits_equal(old, new)
        return
    assert bits_equal(apply_tensor_delta(old, delta), new)
    assert delta.changed == changed_elements(old, new)


@settings(max_examples=100, deadline=None)
@given(st.lists(tensor_pairs(), min_size=1, max_size=4))
def test_state_delta_round_trips_through_its_flat_form(pairs) -> None:
    old = {f"layer.{i}.weight": a for i, (a, _) in enumerate(pairs)}
    new = {f"layer.{i}.weight": b for i, (_, b) in enumerate(pairs)}
    flat, described = state_delta(old, new).to_flat()
    rebuilt = apply_delta(old, StateDelta.from_flat(flat, described))
    assert state_sha256(rebuilt) == state_sha256(new)


def test_each_encoding_is_chosen_where_it_is_smallest() -> None:
    old = torch.zeros(10_000, dtype=torch.bfloat16)
    for where, encoding in (
        (torch.arange(0, 10_000, 2_000), "index"),  # long gaps: 8 bytes each
        (torch.arange(0, 10_000, 20), "gaps"),
        (torch.arange(0, 3_000), "mask"),
        (torch.arange(0, 9_900), "dense"),
    ):
        new = old.clone()
        new[where] = 1.0
        delta = tensor_delta(old, new)
        assert delta is not None and delta.encoding == encoding and delta.changed == where.numel()
        assert bits_equal(apply_tensor_delta(old, delta), new)
    sparse = tensor_delta(old, torch.cat([torch.ones(10), torch.zeros(9_990)]).to(torch.bfloat16))
    assert (
        sparse is not None and sparse.encoding == "gaps" and sparse.nbytes == 10 * (2 + 1)
    )  # a byte per gap + bf16 values


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3_000), unique=True, max_size=60))
def test_gaps_round_trip_including_gaps_past_a_byte(positions) -> None:
    where = torch.tensor(sorted(positions), dtype=torch.long)
    assert torch.equal(decode_gaps(encode_gaps(where)), where)


def test_signed_zero_and_nan_payloads_count_as_changes() -> None:
    old = torch.tensor([0.0, float("nan"), 1.0])
    new = torch.tensor([-0.0, float("nan"), 1.0])
    new.view(torch.int32)[1] += 1  # another NaN payload
    delta = tensor_delta(old, new)
    assert delta is not None and delta.changed == 2
    assert bits_equal(apply_tensor_delta(old, delta), new)


def test_checksum_tells_states_apart_by_name_dtype_shape_and_bits() -> None:
    base = {"a": torch.arange(6, dtype=torch.float32)}
    assert state_sha256(base) == state_sha256({"a": torch.arange(6, dtype=torch.float32)})
    others = [
        {"b": base["a"]},
        {"a": base["a"].to(torch.float64)},
        {"a": base["a"].reshape(2, 3)},
        {"a": base["a"] + 1e-6},
    ]
    assert len({state_sha256(s) for s in others} | {state_sha256(base)}) == 5


def test_a_delta_that_does_not_fit_is_refused_naming_the_tensor() -> None:
    old = {"w": torch.zeros(4), "b": torch.zeros(2)}
    with pytest.raises(DeltaMismatch, match="tensor names changed"):
        state_delta(old, {"w": torch.zeros(4)})
    with pytest.raises(DeltaMismatch, match="tensor 'w': shape/dtype changed"):
        state_delta(old, {"w": torch.zeros(5), "b": torch.zeros(2)})
    delta = state_delta(old, {"w": torch.ones(4), "b": torch.zeros(2)})
    with pytest.raises(DeltaMismatch, match="tensor 'w'"):
        apply_delta({"w": torch.zeros(3), "b": torch.zeros(2)}, delta)
    with pytest.raises(DeltaMismatch, match="lacks"):
        apply_delta({"b": torch.zeros(2)}, delta)
    flat, described = delta.to_flat()
    with pytest.raises(DeltaMismatch, match="lacks 'w/values'"):
        StateDelta.from_flat({}, described)
