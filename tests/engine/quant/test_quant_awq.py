"""Activation-aware scaling: beats round-to-nearest int4 where a few input channels dominate."""
from __future__ import annotations

import pytest
import torch

from tightfit.engine.quant.awq import (
    apply_clip, fold_into_norm, fold_into_rows, search_clip, search_scales)
from tightfit.engine.quant.linear import Int4Linear
from tightfit.engine.quant.reference import fake_quantize_int4
from tightfit.errors import TightfitError

IN, OUT = 512, 256


def _activations(n: int, seed: int) -> torch.Tensor:
    """Gaussian activations where 8 input channels are 30x larger (LLM-style outliers)."""
    x = torch.randn(n, IN, generator=torch.Generator().manual_seed(seed))
    x[:, 3:200:25] *= 30
    return x


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


@pytest.fixture(scope="module")
def layer() -> torch.Tensor:
    return torch.randn(OUT, IN, generator=torch.Generator().manual_seed(7)) * 0.02


@pytest.mark.parametrize("group", [64, 128])
def test_awq_beats_round_to_nearest(layer: torch.Tensor, group: int) -> None:
    calib, held_out = _activations(512, 1), _activations(256, 2)
    res = search_scales([layer], calib, group)
    assert 0 < res.alpha <= 1 and res.loss < res.rtn_loss
    ref = held_out @ layer.t()
    rtn = Int4Linear.from_float(layer, group, compute="fp32")(held_out)
    awq = Int4Linear.from_float(layer, group, input_scale=res.scales, compute="fp32")(held_out)
    # Measured ~0.09-0.10 -> ~0.055-0.06 here; demand a clear margin.
    assert _rel_err(awq, ref) < 0.8 * _rel_err(rtn, ref)


def test_group_search_uses_all_weights_and_is_deterministic(layer: torch.Tensor) -> None:
    x = _activations(3000, 3)
    other = torch.randn(64, IN, generator=torch.Generator().manual_seed(8)) * 0.02
    a = search_scales([layer, other], x, 64, max_tokens=1000, seed=5)
    b = search_scales([layer, other], x, 64, max_tokens=1000, seed=5)
    assert torch.equal(a.scales, b.scales) and a.losses == b.losses
    assert len(a.alphas) == 21 and a.alphas[0] == 0.0 and a.alphas[-1] == 1.0
    # The loss covers every weight of the group (and another seed samples other tokens).
    alone = search_scales([layer], x, 64, max_tokens=1000, seed=5)
    assert alone.losses != a.losses
    assert search_scales([layer, other], x, 64, max_tokens=1000, seed=6).losses != a.losses
    with pytest.raises(TightfitError, match="inputs"):
        search_scales([layer, torch.zeros(4, IN + 1)], x, 64)


def test_clip_search_never_hurts_calibration_error(layer: torch.Tensor) -> None:
    x = _activations(256, 4)
    max_abs = search_clip(layer, x, 64, row_chunk=100)
    assert max_abs.shape == (OUT, IN // 64)
    org_max = layer.abs().reshape(OUT, -1, 64).amax(dim=2)
    assert torch.all(max_abs <= org_max) and torch.all(max_abs >= org_max * 0.5)
    clipped = apply_clip(layer, max_abs, 64)
    ref = x @ layer.t()
    err_clip = _rel_err(x @ fake_quantize_int4(clipped, 64).t(), ref)
    err_rtn = _rel_err(x @ fake_quantize_int4(layer, 64).t(), ref)
    assert err_clip <= err_rtn


def test_clip_handles_padded_groups() -> None:
    w = torch.randn(32, 576, generator=torch.Generator().manual_seed(0))
    x = torch.randn(64, 576, generator=torch.Generator().manual_seed(1))
    max_abs = search_clip(w, x, 128)
    assert max_abs.shape == (32, 5)
    assert apply_clip(w, max_abs, 128).shape == (32, 576)


def test_folding_preserves_the_fp32_function(layer: torch.Tensor) -> None:
    x = _activations(16, 5)
    s = search_scales([layer], x, 64).scales
    norm_w = torch.rand(IN, generator=torch.Generator().manual_seed(9)) + 0.5
    before = (x * norm_w) @ layer.t()
    after = (x * fold_into_norm(norm_w, s)) @ (layer * s).t()
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    # A previous linear's rows (e.g. up_proj feeding down_proj) absorb 1/s the same way.
    prev = torch.randn(IN, 64, generator=torch.Generator().manual_seed(10))
    prev_b = torch.randn(IN, generator=torch.Generator().manual_seed(11))
    h = torch.randn(4, 64, generator=torch.Generator().manual_seed(12))
    pw, pb = fold_into_rows(prev, prev_b, s)
    torch.testing.assert_close((h @ pw.t() + pb) @ (layer * s).t(),
                               (h @ prev.t() + prev_b) @ layer.t(), rtol=1e-4, atol=1e-4)
