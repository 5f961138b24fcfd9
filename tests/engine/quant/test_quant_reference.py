"""The plain-torch reference quantisers that the packed modules are checked against."""
from __future__ import annotations

import pytest
import torch

from tightfit.engine.quant.reference import (
    dequantize_int4, dequantize_int8, quantize_int4, quantize_int8)
from tightfit.errors import TightfitError


def _weight(out_f: int, in_f: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_int8_error_is_at_most_half_a_step() -> None:
    w = _weight(64, 200)
    qw = quantize_int8(w)
    assert qw.q.dtype == torch.int8 and qw.q.abs().max() <= 127
    err = (dequantize_int8(qw) - w).abs()
    assert torch.all(err <= qw.scales[:, None] / 2 * (1 + 1e-5))
    # The largest |w| of each row maps to +-127.
    assert torch.equal(qw.q.abs().amax(dim=1), torch.full((64,), 127, dtype=torch.int8))


def test_int8_zero_row() -> None:
    w = _weight(4, 16)
    w[2] = 0
    assert torch.equal(dequantize_int8(quantize_int8(w))[2], torch.zeros(16))


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_error_is_at_most_half_a_step(group: int) -> None:
    w = _weight(48, 512)
    qw = quantize_int4(w, group)
    assert qw.codes.dtype == torch.uint8 and int(qw.codes.max()) <= 15
    assert qw.scales.shape == (48, 512 // group)
    step = qw.scales.repeat_interleave(group, dim=1)
    assert torch.all((dequantize_int4(qw) - w).abs() <= step / 2 + 1e-6)


def test_int4_convention_matches_torch_kernel() -> None:
    # value = (code - 8) * scale + zero; the group min is code 0, the max code 15.
    w = _weight(16, 64)
    qw = quantize_int4(w, 32)
    deq = dequantize_int4(qw).reshape(16, 2, 32)
    groups = w.reshape(16, 2, 32)
    torch.testing.assert_close(deq.amin(dim=2), groups.amin(dim=2), rtol=0, atol=1e-6)
    torch.testing.assert_close(deq.amax(dim=2), groups.amax(dim=2), rtol=0, atol=1e-6)
    torch.testing.assert_close(qw.zeros, groups.amin(dim=2) + 8 * qw.scales)


def test_int4_constant_group_is_exact() -> None:
    w = _weight(16, 64)
    w[3, :32] = 0.25
    w[4, 32:] = 0.0
    deq = dequantize_int4(quantize_int4(w, 32))
    assert torch.equal(deq[3, :32], w[3, :32])
    assert torch.equal(deq[4, 32:], w[4, 32:])


def test_int4_padding_keeps_last_group_range() -> None:
    # 576 = 4.5 groups of 128: the last group holds 64 real columns and 64 of padding. Its
    # scale must come from the real columns only, i.e. match quantising them alone.
    w = _weight(16, 576)
    qw = quantize_int4(w, 128)
    assert qw.codes.shape == (16, 640) and qw.in_features == 576
    tail = quantize_int4(w[:, 512:], 64)
    torch.testing.assert_close(qw.scales[:, 4], tail.scales[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(qw.zeros[:, 4], tail.zeros[:, 0], rtol=0, atol=0)
    assert dequantize_int4(qw).shape == (16, 576)


def test_int4_without_padding_names_the_dimension() -> None:
    with pytest.raises(TightfitError, match=r"group size 128 does not divide the input "
                                            r"dimension 576.*32, 64"):
        quantize_int4(_weight(16, 576), 128, pad=False)
