"""Packed int8/int4 modules against the plain quantise -> dequantise -> F.linear reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tightfit.engine.quant.linear as linear_mod
from tightfit.engine.quant.formats import weight_nbytes
from tightfit.engine.quant.linear import Int4Linear, Int8Linear, quantize_linear
from tightfit.engine.quant.reference import (
    quantize_int4, quantize_int8, reference_linear, round_bf16)
from tightfit.errors import TightfitError

# (out, in) pairs: the default model's projections, plus N not a multiple of 16 and small K.
SHAPES = [(576, 576), (1536, 576), (576, 1536), (100, 96)]


def _rand(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _assert_fp32_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32 compute: equal to the reference up to summation order (measured ~1e-6)."""
    rel = float((y - ref).abs().max() / ref.abs().max())
    assert rel < 1e-5, rel


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values (8 significant bits) around each element of t."""
    _, exponent = torch.frexp(t)
    return torch.ldexp(torch.ones_like(t), exponent - 8)


def _assert_bf16_close(y: torch.Tensor, ref: torch.Tensor, bias: torch.Tensor | None = None
                       ) -> None:
    """bf16 compute: the kernel and the reference both round an fp32 sum to bf16; their sums
    differ only in summation order, so almost all elements agree exactly and the rest by one
    bf16 step (a sum that lands next to a rounding midpoint can go either way)."""
    core = ref if bias is None else ref - bias
    diff = (y - ref).abs()
    assert torch.all(diff <= _bf16_ulp(core) + 1e-6 * ref.abs().max()), float(diff.max())
    assert float((diff > 1e-6 * ref.abs().max()).float().mean()) < 0.01


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("shape", SHAPES)
def test_int4_matches_reference(shape: tuple[int, int], group: int, m: int) -> None:
    out_f, in_f = shape
    w, b, x = _rand(out_f, in_f, scale=0.05), _rand(out_f, seed=1), _rand(m, in_f, seed=2)
    qw = quantize_int4(w, group)  # pads 576 -> 640 for group 128, 96 -> 128 for group 64/128
    _assert_bf16_close(Int4Linear.from_float(w, group, b)(x), reference_linear(
        x, qw, b, compute="bf16"), b)
    _assert_fp32_close(Int4Linear.from_float(w, group, b, compute="fp32")(x),
                       reference_linear(x, qw, b))


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_matches_reference(shape: tuple[int, int], m: int) -> None:
    out_f, in_f = shape
    w, b, x = _rand(out_f, in_f, scale=0.05), _rand(out_f, seed=1), _rand(m, in_f, seed=2)
    qw = quantize_int8(w)
    _assert_bf16_close(Int8Linear.from_float(w, b, compute="bf16")(x), reference_linear(
        x, qw, b, compute="bf16"), b)
    _assert_fp32_close(Int8Linear.from_float(w, b, compute="fp32")(x), reference_linear(x, qw, b))
    # The default kernel: int8x2 where fbgemm runs (~15-bit activations), else bf16.
    mod = Int8Linear.from_float(w, b)
    if mod.compute == "int8x2":
        _assert_int8x2_close(mod(x), reference_linear(x, qw, b))
    else:
        _assert_bf16_close(mod(x), reference_linear(x, qw, b, compute="bf16"), b)


def _assert_int8x2_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """int8x2: each input row in two int8 parts keeps ~15 bits of its largest value: within 5e-4
    of the largest output even for a row with one 100x outlier (bf16 activations are off by up
    to ~1e-2 of it)."""
    rel = float((y - ref).abs().max() / ref.abs().max())
    assert rel < 5e-4, rel


int8x2 = pytest.mark.skipif(not linear_mod.int8x2_supported(),
                            reason="fbgemm's int8 GEMM is not available in this torch build")


@int8x2
def test_int8x2_rows_do_not_depend_on_their_batch() -> None:
    """Each row is quantised on its own (the +-1 anchor columns fix fbgemm's range), so a
    request's logits do not change with what else is batched: rows of any magnitude, a zero row
    and a row with one outlier give bit-identical results alone and together."""
    w = _rand(300, 200, scale=0.05)  # 200: not a multiple of 16 either
    mod = Int8Linear.from_float(w, compute="int8x2")
    x = _rand(5, 200, seed=2)
    x[1] *= 1e-6
    x[2] = 0.0
    x[3, 7] = 500.0
    x[4] *= 1e6
    together = mod(x)
    for i in range(5):
        assert torch.equal(mod(x[i:i + 1]), together[i:i + 1])
    assert torch.equal(together[2], torch.zeros(300))
    ref = reference_linear(x, quantize_int8(w))
    for i in (0, 1, 3, 4):  # the relative precision holds at every scale
        _assert_int8x2_close(together[i], ref[i])


@int8x2
def test_int8x2_keeps_only_the_packed_weight_and_exports_the_same_codes() -> None:
    w = _rand(576, 576, scale=0.05)
    mod = Int8Linear.from_float(w, compute="int8x2")
    assert mod.weight_int8 is None and mod.packed is not None
    assert torch.equal(mod.codes(), quantize_int8(w).q)
    assert torch.equal(Int8Linear(mod.codes(), mod.scales, compute="int8x2")(w[:3]), mod(w[:3]))


@int8x2
def test_int8x2_in_row_blocks_and_many_input_rows_gives_the_same_numbers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights packed in several output-row blocks (as big heads are, to bound the load peak)
    and inputs of more rows than one call takes compute exactly what one block / one call
    does."""
    w, x = _rand(9000, 64, scale=0.05), _rand(300, 64, seed=2)
    whole = Int8Linear.from_float(w, compute="int8x2")
    monkeypatch.setattr(linear_mod, "PACK_BLOCK_BYTES", 4096 * 66)  # 4096 rows a block
    blocks = Int8Linear.from_float(w, compute="int8x2")
    assert len(whole.packed) == 1 and len(blocks.packed) == 3
    assert torch.equal(blocks.codes(), whole.codes())
    assert torch.equal(blocks(x), whole(x))
    assert torch.equal(whole(x), torch.cat([whole(x[:150]), whole(x[150:])]))  # 300 = 256 + 44


@int8x2
def test_int8x2_with_7_bit_activations_as_on_cpus_without_vnni() -> None:
    """Without VNNI fbgemm needs 7-bit activations (reduce_range); the split then works on a
    127-step grid and still keeps ~13 bits (measured 1.2e-4 of the largest output vs 2.9e-5
    with 8 bits), batch-independent."""
    w, x = _rand(300, 200, scale=0.05), _rand(5, 200, seed=2)
    mod = Int8Linear.from_float(w, compute="int8x2")
    y = linear_mod.int8x2_linear(x, mod.packed, 127.0)
    rel = float((y - reference_linear(x, quantize_int8(w))).abs().max() / y.abs().max())
    assert rel < 5e-4, rel
    assert torch.equal(linear_mod.int8x2_linear(x[2:3], mod.packed, 127.0), y[2:3])


def test_int8_falls_back_to_bf16_without_fbgemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_mod, "int8x2_supported", lambda: False)
    w, x = _rand(64, 200, scale=0.05), _rand(3, 200, seed=2)
    mod = Int8Linear.from_float(w, compute="int8x2")
    assert mod.compute == "bf16" and mod.packed is None
    # 200 inputs: _weight_int8pack_mm crashes unless in is a multiple of 16; zero-padded
    _assert_bf16_close(mod(x), reference_linear(x, quantize_int8(w), compute="bf16"))
    assert torch.equal(mod.codes(), quantize_int8(w).q)


def test_int4_refuses_the_int8x2_compute() -> None:
    with pytest.raises(TightfitError, match="int8x2"):
        Int4Linear.from_float(_rand(64, 64), 32, compute="int8x2")  # type: ignore[arg-type]


def test_bf16_compute_error_is_small_next_to_quantisation_error() -> None:
    w, x = _rand(1536, 576, scale=0.05), _rand(16, 576, seed=2)
    exact = F.linear(x, w)
    qw = quantize_int4(w, 64)
    fast = Int4Linear.from_float(w, 64)(x)
    bf16_err = (fast - reference_linear(x, qw)).norm() / exact.norm()
    quant_err = (reference_linear(x, qw) - exact).norm() / exact.norm()
    assert bf16_err < 0.005 and bf16_err < quant_err / 10, (bf16_err, quant_err)


@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-g128"])
def test_leading_shapes_and_layouts(fmt: str) -> None:
    w = _rand(64, 96, scale=0.05)
    mod = quantize_linear(w, None, fmt)
    x = _rand(2, 3, 96, seed=3)
    y = mod(x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.float32
    torch.testing.assert_close(y, mod(x.reshape(6, 96)).reshape(2, 3, 64))
    assert mod(x[0, 0]).shape == (64,)
    assert mod(torch.zeros(0, 96)).shape == (0, 64)
    # A non-contiguous input (a transposed view) gives the same result.
    xt = _rand(96, 6, seed=4).t()
    torch.testing.assert_close(mod(xt), mod(xt.contiguous()))


@pytest.mark.parametrize("fmt", ["int8", "int4-g64"])
def test_input_scale_is_divided_out(fmt: str) -> None:
    w, x = _rand(128, 192, scale=0.05), _rand(4, 192, seed=2)
    s = _rand(192, seed=5).abs() + 0.5
    mod = quantize_linear(w, None, fmt, input_scale=s, compute="fp32")
    ws = w * s
    qw = quantize_int8(ws) if fmt == "int8" else quantize_int4(ws, 64)
    _assert_fp32_close(mod(x), reference_linear(x, qw, input_scale=s))
    # Still a stand-in for x @ W.T (up to int quantisation error).
    assert float((mod(x) - F.linear(x, w)).norm() / F.linear(x, w).norm()) < 0.25


@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-g64", "int4-g128"])
@pytest.mark.parametrize("shape", [(576, 576), (100, 96)])
def test_no_fp32_weight_is_kept(fmt: str, shape: tuple[int, int]) -> None:
    out_f, in_f = shape
    w = _rand(out_f, in_f, scale=0.05)
    mod = quantize_linear(w, None, fmt)
    tensors = list(mod.parameters()) + list(mod.buffers())
    assert not any(t.is_floating_point() and t.numel() >= out_f * in_f // 4 for t in tensors)
    assert not any(t.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
                   for t in tensors)
    # The stored bytes are what the memory accounting predicts: exactly, or under int8x2 (fbgemm's
    # packed copy, two anchor columns, fp32 scales, column offsets) within 24 bytes a row.
    held = sum(t.numel() * t.element_size() for t in tensors) + getattr(mod, "packed_nbytes", 0)
    slack = 24 * out_f if getattr(mod, "compute", "") == "int8x2" else 0
    assert 0 <= held - weight_nbytes(fmt, out_f, in_f) <= slack


def test_fp32_format_is_a_plain_linear_sharing_the_weight() -> None:
    w, b, x = _rand(64, 96), _rand(64, seed=1), _rand(3, 96, seed=2)
    mod = quantize_linear(w, b, "fp32")
    assert isinstance(mod, nn.Linear)
    assert mod.weight.data_ptr() == w.data_ptr()
    torch.testing.assert_close(mod(x), F.linear(x, w, b), rtol=0, atol=0)


def test_int4_export_round_trip() -> None:
    w = _rand(100, 576, scale=0.05)
    qw = quantize_int4(w, 128)
    mod = Int4Linear.from_float(w, 128)
    assert torch.equal(mod.codes(), qw.codes)
    assert torch.equal(mod.scales, round_bf16(qw.scales))
    assert torch.equal(mod.zeros, round_bf16(qw.zeros))
    # The packed layout is ISA-specific, so it is not part of the state dict.
    assert "weight_packed" not in mod.state_dict()


def test_chunked_packing_equals_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _rand(200, 64, scale=0.05)
    whole = Int4Linear.from_float(w, 32)
    monkeypatch.setattr(linear_mod, "_ROW_CHUNK", 64)
    chunked = Int4Linear.from_float(w, 32)
    assert torch.equal(whole.weight_packed, chunked.weight_packed)
    assert torch.equal(whole.scales_and_zeros, chunked.scales_and_zeros)


def test_group_that_does_not_divide_without_padding() -> None:
    with pytest.raises(TightfitError, match=r"576.*32, 64"):
        quantize_linear(_rand(64, 576), None, "int4-g128", pad=False)


def test_bad_arguments() -> None:
    w = _rand(64, 96)
    with pytest.raises(TightfitError, match="native"):
        quantize_linear(w, None, "native")
    with pytest.raises(TightfitError, match="unknown weight format"):
        quantize_linear(w, None, "int2")
    with pytest.raises(TightfitError, match="bias"):
        quantize_linear(w, torch.zeros(63), "int8")
    with pytest.raises(TightfitError, match="input_scale"):
        quantize_linear(w, None, "int4-g32", input_scale=torch.zeros(96))
    with pytest.raises(TightfitError, match="compute"):
        quantize_linear(w, None, "int8", compute="fp16")  # type: ignore[arg-type]
    with pytest.raises(TightfitError, match="2-D"):
        quantize_linear(torch.zeros(96), None, "int8")


@pytest.mark.parametrize("fmt", ["int8", "int4-g64"])
def test_module_survives_copies_and_dtype_casts(fmt: str) -> None:
    import copy

    w, b, x = _rand(64, 128, scale=0.05), _rand(64, seed=1), _rand(3, 128, seed=2)
    mod = quantize_linear(w, b, fmt)
    y = mod(x)
    clone = copy.deepcopy(mod)
    torch.testing.assert_close(clone(x), y, rtol=0, atol=0)
    # A model-wide .float() / .half() must not break the kernels' dtype requirements.
    wrapper = nn.Sequential(mod).float().half().to(torch.float32)
    torch.testing.assert_close(wrapper(x), y, rtol=0, atol=0)
    assert mod.bias is not None and mod.bias.dtype == torch.float32


def test_fused_projections_equal_separate_ones() -> None:
    # q/k/v (or gate/up) concatenated by rows: one kernel call, the same numbers per row.
    from tightfit.engine.quant.reference import concat_rows

    ws = [_rand(576, 576, scale=0.05), _rand(192, 576, seed=1, scale=0.05),
          _rand(192, 576, seed=2, scale=0.05)]
    x = _rand(4, 576, seed=3)
    for quantize, build in ((lambda w: quantize_int4(w, 64), Int4Linear.from_weights),
                            (quantize_int8, Int8Linear.from_weights)):
        parts = [quantize(w) for w in ws]
        fused = build(concat_rows(parts))(x)
        separate = torch.cat([build(p)(x) for p in parts], dim=-1)
        torch.testing.assert_close(fused, separate, rtol=0, atol=0)


def test_damaged_int4_weights_are_rejected() -> None:
    from dataclasses import replace

    qw = quantize_int4(_rand(32, 128), 64)
    with pytest.raises(TightfitError, match="scales have shape"):
        Int4Linear.from_weights(replace(qw, scales=qw.scales[:, :1]))
    with pytest.raises(TightfitError, match="0..15"):
        Int4Linear.from_weights(replace(qw, codes=qw.codes + 16))
    with pytest.raises(TightfitError, match="group size 32"):
        Int4Linear.from_weights(replace(qw, group_size=32))


@pytest.mark.parametrize("compute", ["bf16", "fp32"])
def test_int8_linear_copies_misaligned_weights_instead_of_crashing(compute):
    """The int8 kernel crashes the process on weights not 64-byte aligned: such a tensor (here a
    view one byte into a buffer, as a file read at an odd offset gives) is copied first."""
    w = _rand(96, 64)
    ref = Int8Linear.from_float(w, compute=compute)
    buf = torch.zeros(96 * 64 + 1, dtype=torch.int8)
    q = buf[1:].view(96, 64)
    q.copy_(ref.weight_int8)
    assert q.data_ptr() % 64 != 0
    mod = Int8Linear(q, ref.scales.float(), compute=compute)
    assert mod.weight_int8.data_ptr() % 64 == 0
    x = _rand(3, 64, seed=1)
    assert torch.equal(mod(x), ref(x))


def test_from_rows_builds_the_same_module_as_from_float():
    """Chunked construction (used for weights dequantised from a file) changes nothing."""
    w = _rand(5000, 64)  # more rows than one chunk
    rows = lambda a, b: w[a:b]  # noqa: E731
    a8, b8 = Int8Linear.from_float(w), Int8Linear.from_rows(rows, (5000, 64))
    assert torch.equal(a8.codes(), b8.codes()) and torch.equal(a8.scales, b8.scales)
    a4, b4 = Int4Linear.from_float(w, 32), Int4Linear.from_rows(rows, (5000, 64), 32)
    x = _rand(2, 64, seed=3)
    assert torch.equal(a4(x), b4(x))


def test_native_rows_match_the_whole_dequantised_weight():
    """NativeTensor.rows(a, b) == dequantize()[a:b], with llama.cpp's Q/K row permutation."""
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.model_config import config_from_gguf
    from tightfit.engine.loader.resolve import resolve_model
    from tightfit.engine.loader.weights import load_gguf_weights

    g = GGUFFile(resolve_model(None))
    weights = load_gguf_weights(g, config_from_gguf(g), keep_native=True)
    checked = 0
    for name in ("layers.0.self_attn.q_proj.weight", "embed_tokens.weight"):
        nt = dict.__getitem__(weights, name)
        if isinstance(nt, torch.Tensor):
            continue
        n = nt.tensor.shape[0]
        parts = torch.cat([nt.rows(a, min(a + 100, n)) for a in range(0, n, 100)])
        assert torch.equal(parts, nt.dequantize())
        checked += 1
    assert checked == 2
