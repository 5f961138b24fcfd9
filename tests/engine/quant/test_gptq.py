"""GPTQ error feedback on a fixed int4 grid: same grid as plain rounding, lower output error on
correlated inputs, packing round trip, padding, and the AWQ builder with and without it."""
from __future__ import annotations

import pytest
import torch

from tightfit.engine.quant.gptq import (
    GramSplit, QuantizedWeight, apply_map, asymmetric_map, gptq_int4, gptq_int4_select,
    gram_matrix, output_error, pack_codes, with_codes)
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


def test_output_error_is_the_mean_squared_output_error() -> None:
    x = _correlated_inputs(256, 64)
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    q = quantize_int4(w, 32)
    assert output_error(w, q, gram_matrix(x)) == pytest.approx(_out_err(x, w, q), rel=1e-4)


def test_gram_split_holds_out_every_nth_sequence() -> None:
    tokens, seqs = 8, 16
    x = _correlated_inputs(seqs * tokens, 32)
    g = GramSplit.of(x, None, tokens, every=8)
    xs = x.reshape(seqs, tokens, 32)
    assert torch.allclose(g.held, gram_matrix(xs[[7, 15]]))
    assert torch.allclose(g.fit, gram_matrix(xs[[i for i in range(seqs) if i not in (7, 15)]]))
    assert torch.allclose(g.all, (14 * g.fit + 2 * g.held) / 16)
    assert torch.allclose(g.all, gram_matrix(x))  # the same as one pass over every token
    assert GramSplit.of(x, None, tokens, every=0).fit is None  # no split asked
    assert GramSplit.of(x[:4], None, tokens, every=8).fit is None  # less than two sequences
    few = GramSplit.of(x[:3 * tokens], None, tokens, every=8)  # fewer than `every`: the last
    assert torch.allclose(few.held, gram_matrix(xs[2]))


def test_damping_is_chosen_on_held_out_sequences() -> None:
    """Few calibration tokens for many inputs: with little damping GPTQ fits the calibration
    Gram matrix and does worse on new inputs; the choice is made on held-out sequences, and
    the chosen damping rounds better on fresh inputs than the smallest candidate."""
    tokens = 16
    x = _correlated_inputs(12 * tokens, 128, seed=6)
    fresh = _correlated_inputs(4096, 128, seed=7)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(8)) * 0.05
    grams = GramSplit.of(x, None, tokens, every=4)
    damps = (1e-4, 0.01, 0.1, 1.0)
    q, chosen = gptq_int4_select(w, grams, 32, damps=damps)
    held_err = {d: output_error(w, gptq_int4(w, grams.fit, 32, damp=d), grams.held)
                for d in damps}
    assert chosen == min(held_err, key=held_err.__getitem__)
    assert torch.equal(q.codes, gptq_int4(w, grams.all, 32, damp=chosen).codes)
    h_fresh = gram_matrix(fresh)
    smallest = gptq_int4(w, grams.all, 32, damp=damps[0])
    assert chosen > damps[0]
    assert output_error(w, q, h_fresh) < output_error(w, smallest, h_fresh)
    # One candidate: no choice, rounded on all tokens.
    one, d = gptq_int4_select(w, grams, 32, damps=(0.05,))
    assert d == 0.05 and torch.equal(one.codes, gptq_int4(w, grams.all, 32, damp=0.05).codes)
    with pytest.raises(TightfitError, match="at least one damping"):
        gptq_int4_select(w, grams, 32, damps=())


def test_asymmetric_target_reproduces_the_reference_output() -> None:
    """Inputs perturbed by earlier rounding: the adjusted weight on the perturbed inputs matches
    the fp32 output better than the weight itself; with unperturbed inputs it is the weight."""
    g = torch.Generator().manual_seed(9)
    x = _correlated_inputs(1024, 64)
    xq = x + 0.2 * torch.randn(x.shape, generator=g) @ torch.randn(64, 64, generator=g) * 0.3
    w = torch.randn(16, 64, generator=g)
    adj = apply_map(w, asymmetric_map(x, xq, damp=1e-4))
    ref = x @ w.t()
    err_adj = float((xq @ adj.t() - ref).pow(2).mean())
    assert err_adj < 0.5 * float((xq @ w.t() - ref).pow(2).mean())
    assert torch.allclose(apply_map(w, asymmetric_map(x, x, damp=1e-6)), w,
                          atol=1e-2)  # ridge only
    # The caller's Gram matrix of x_q gives the same map as computing it here.
    assert torch.allclose(asymmetric_map(x, xq, gram_matrix(xq), damp=1e-4),
                          asymmetric_map(x, xq, damp=1e-4))
    with pytest.raises(TightfitError, match="same tokens"):
        asymmetric_map(x, x[:10])


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
    for gptq, inputs in ((False, "fp32"), (True, "fp32"), (True, "quantized"),
                         (True, "asymmetric")):
        settings = CalibrationSettings(sequences=4, tokens=64, search_tokens=256, gptq=gptq,
                                       gptq_inputs=inputs)
        model = build_awq_model(cfg, _tiny_weights(cfg), plan, ByteTokenizer(), settings)
        errs[gptq, inputs] = _rel(_logits(model, cfg, ids), ref)
    for inputs in ("fp32", "quantized", "asymmetric"):
        assert errs[True, inputs] < errs[False, "fp32"], errs
    # The cached codes (asymmetric targets, damping chosen per projection) rebuild the same model
    # without calibration (no tokenizer).
    again = build_awq_model(cfg, _tiny_weights(cfg), plan, None, settings)
    assert torch.equal(_logits(again, cfg, ids), _logits(model, cfg, ids))
