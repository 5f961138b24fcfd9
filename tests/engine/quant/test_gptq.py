"""GPTQ error feedback on a fixed int4 grid: same grid as plain rounding, lower output error on
correlated inputs, packing round trip, padding, and the AWQ builder with and without it."""
from __future__ import annotations

import pytest
import torch

from tightfit.engine.quant.gptq import (
    QuantizedWeight, gptq_int4, gram_matrix, pack_codes, with_codes)
from tightfit.engine.quant.reference import dequantize_int4, quantize_int4
from tightfit.errors import TightfitError


def _correlated_inputs(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g) @ torch.randn(32, k, generator=g)
    x += 0.3 * torch.randn(n, k, generator=g)
    x[:, :4] *= 10  # outlier channels
    return x


def _out_err(x: torch.Tensor, w: torch.Tensor, q) -> float:
    return float((x @ (dequantize_int4(q) - w).t()).pow(2).mean())


@pytest.mark.parametrize("group", [32, 64, 128])
def test_gptq_keeps_the_grid_and_lowers_output_error(group: int) -> None:
    x = _correlated_inputs(2048, 192)
    w = torch.randn(48, 192, generator=torch.Generator().manual_seed(1)) * 0.05
    rtn = quantize_int4(w, group)  # 192 is padded to 256 for group 128
    q = gptq_int4(w, gram_matrix(x), group)
    assert torch.equal(q.scales, rtn.scales) and torch.equal(q.zeros, rtn.zeros)
    assert q.codes.shape == rtn.codes.shape and int(q.codes.max()) <= 15
    assert _out_err(x, w, q) < 0.5 * _out_err(x, w, rtn)
    # Without act order it still helps, a little less.
    plain = gptq_int4(w, gram_matrix(x), group, act_order=False)
    assert _out_err(x, w, plain) < _out_err(x, w, rtn)


def test_uncorrelated_inputs_reduce_to_rounding_to_nearest() -> None:
    """With a diagonal H no error can be passed on usefully: GPTQ equals plain rounding."""
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    h = torch.diag(torch.rand(64, generator=torch.Generator().manual_seed(3)) + 0.5)
    q = gptq_int4(w, h.to(torch.float64), 32)
    assert torch.equal(q.codes, quantize_int4(w, 32).codes)


def test_grid_weight_and_pack_round_trip() -> None:
    x = _correlated_inputs(512, 64)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(4))
    clipped = w.clamp(-1.5, 1.5)
    q = gptq_int4(w, gram_matrix(x, torch.full((64,), 2.0)), 32, grid_weight=clipped)
    assert torch.equal(q.scales, quantize_int4(clipped, 32).scales)
    back = with_codes(clipped, 32, pack_codes(q))
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros)
    assert torch.equal(QuantizedWeight(q).dequantize(), dequantize_int4(q))


def test_bad_shapes_name_the_mismatch() -> None:
    with pytest.raises(TightfitError, match=r"\(32, 32\) does not match a weight with 64"):
        gptq_int4(torch.zeros(8, 64), torch.eye(32), 32)
    with pytest.raises(TightfitError, match="grid weight shape"):
        gptq_int4(torch.zeros(8, 64), torch.eye(64), 32, grid_weight=torch.zeros(4, 64))
    with pytest.raises(TightfitError, match="at least one calibration token"):
        gram_matrix(torch.zeros(0, 8))


def test_awq_builder_with_gptq_is_closer_to_fp32_and_replays_from_cache(tmp_path, monkeypatch
                                                                          ) -> None:
    from tests.engine.quant.test_awq_model import (
        ByteTokenizer, _logits, _rel, _tiny_config, _tiny_weights)
    from tightfit.engine.models.transformer import DecoderModel
    from tightfit.engine.quant.awq_model import CalibrationSettings, build_awq_model
    from tightfit.engine.quant.plan import PrecisionPlan

    monkeypatch.setenv("TIGHTFIT_CACHE_DIR", str(tmp_path))
    cfg = _tiny_config("gqa")
    ids = torch.tensor(ByteTokenizer().encode("for i in range(10):\n    print(i, i * i)\n"))
    ref = _logits(DecoderModel(cfg, _tiny_weights(cfg)), cfg, ids)
    plan = PrecisionPlan.parse("int4-awq-g64")
    errs = {}
    for gptq in (False, True):
        settings = CalibrationSettings(sequences=4, tokens=64, search_tokens=256, gptq=gptq)
        model = build_awq_model(cfg, _tiny_weights(cfg), plan, ByteTokenizer(), settings)
        errs[gptq] = _rel(_logits(model, cfg, ids), ref)
    assert errs[True] < errs[False], errs
    # The cached codes rebuild the same model without calibration (no tokenizer).
    again = build_awq_model(cfg, _tiny_weights(cfg), plan, None, settings)
    assert torch.equal(_logits(again, cfg, ids), _logits(model, cfg, ids))
