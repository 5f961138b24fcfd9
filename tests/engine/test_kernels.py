"""The fused decode kernels (engine/kernels/decode.cpp) op by op against the torch formulas they
replace (layers.rms_norm, layers.apply_rotary, the cache write, attention.reference_attention,
F.silu / F.gelu): fp32 outputs to float rounding; bf16 outputs equal to the reference rounded
to bf16 except where the two fp32 values straddle a rounding boundary (one bf16 step apart).
Skipped where no C++ compiler can build them (decode then runs the plain TorchScript stack)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tightfit.engine import kernels
from tightfit.engine.attention import AttentionMetadata, reference_attention
from tightfit.engine.models.layers import apply_rotary, rms_norm

pytestmark = pytest.mark.skipif(not kernels.load(), reason=f"kernels: {kernels.why_not()}")
ops = torch.ops.tightfit if kernels.load() else None


def _close_bf16(got: torch.Tensor, ref32: torch.Tensor) -> None:
    """got (bf16) is ref32 rounded to bf16, or one bf16 step off where ref32 lies at a rounding
    boundary (the fused kernel's fp32 value differs from torch's by float rounding)."""
    assert got.dtype == torch.bfloat16
    ref = ref32.to(torch.bfloat16)
    off = (got != ref) & (ref32.abs() > 1e-6)
    assert off.float().mean() < 0.01, f"{int(off.sum())} of {off.numel()} bf16 values differ"
    step = ref32.abs() * 2.0 ** -7 + 1e-5  # one bf16 step (+ fp32 noise near zero)
    assert ((got.float() - ref32).abs() <= step).all()


def test_rms_norm_to_fp32_and_bf16():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 576, generator=g) * 3
    w = torch.rand(576, generator=g) + 0.5
    ref = rms_norm(x, w, 1e-5)
    torch.testing.assert_close(ops.rms_norm_to(x, w, 1e-5, False), ref, rtol=1e-5, atol=1e-6)
    _close_bf16(ops.rms_norm_to(x, w, 1e-5, True), ref)


@pytest.mark.parametrize("post", [False, True])
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_residual_norm(post, h_dtype):
    g = torch.Generator().manual_seed(1)
    x, h = torch.randn(3, 640, generator=g), torch.randn(3, 640, generator=g).to(h_dtype)
    w, pw = torch.rand(640, generator=g) + 0.5, torch.rand(640, generator=g) + 0.5
    hf = h.float()
    x_ref = x + (rms_norm(hf, pw, 1e-6) if post else hf)
    x_new, normed = ops.residual_norm(x, h, pw if post else None, w, 1e-6, False)
    torch.testing.assert_close(x_new, x_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(normed, rms_norm(x_ref, w, 1e-6), rtol=1e-5, atol=1e-5)
    _, normed16 = ops.residual_norm(x, h, pw if post else None, w, 1e-6, True)
    _close_bf16(normed16, rms_norm(x_ref, w, 1e-6))


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("qkv_dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv(qk_norm, qkv_dtype):
    g = torch.Generator().manual_seed(2)
    t, H, Hkv, D, nb, bs = 3, 9, 3, 64, 6, 4
    qkv = torch.randn(t, (H + 2 * Hkv) * D, generator=g).to(qkv_dtype)
    pos = torch.tensor([0, 5, 17])
    freqs = torch.outer(pos.float(), 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    sin[..., :D // 2] = -sin[..., :D // 2]
    qn, kn = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    slots = torch.tensor([2, 13, 22])
    k_cache, v_cache = torch.zeros(nb, bs, Hkv, D), torch.zeros(nb, bs, Hkv, D)
    q = ops.rope_write_kv(qkv, cos, sin, slots, k_cache, v_cache, H, Hkv,
                          qn if qk_norm else None, kn if qk_norm else None, 1e-6)
    x = qkv.float()
    q_ref, k_ref = x[:, :H * D].view(t, H, D), x[:, H * D:(H + Hkv) * D].view(t, Hkv, D)
    if qk_norm:
        q_ref, k_ref = rms_norm(q_ref, qn, 1e-6), rms_norm(k_ref, kn, 1e-6)
    q_ref, k_ref = apply_rotary(q_ref, cos, sin, D // 2), apply_rotary(k_ref, cos, sin, D // 2)
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)
    flat_k, flat_v = k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D)
    torch.testing.assert_close(flat_k[slots], k_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(flat_v[slots], x[:, (H + Hkv) * D:].view(t, Hkv, D))
    untouched = torch.ones(nb * bs, dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


@pytest.mark.parametrize("window", [0, 7])
def test_decode_attention_against_the_reference(window):
    """Three sequences in two groups (as the runner's length buckets), scattered blocks, GQA."""
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, bs, n_blocks = 6, 2, 32, 4, 24
    k_cache = torch.randn(n_blocks, bs, Hkv, D, generator=g)
    v_cache = torch.randn(n_blocks, bs, Hkv, D, generator=g)
    tables = [[5, 2, 9], [7, 1, 3, 11, 20, 4], [0, 8]]
    lengths = [10, 23, 6]  # context length of each sequence (its query is the last position)
    q = torch.randn(3, H, D, generator=g)
    meta = AttentionMetadata(slot_mapping=torch.empty(0), groups=[], query_starts=[0, 1, 2],
                             query_positions=[[n - 1] for n in lengths], context_lens=lengths,
                             block_tables=tables)
    ref = reference_attention(q, k_cache, v_cache, meta, 0.125, window or None)
    positions = torch.tensor([n - 1 for n in lengths])
    blocks = [torch.tensor([tables[0] + [0] * 3]),  # a group padded to 6 blocks
              torch.tensor([tables[1], tables[2] + [0] * 4])]
    out = ops.decode_attention(q, k_cache, v_cache, positions, [0, 1], blocks, window, 0.125,
                               False)
    torch.testing.assert_close(out.view(3, H, D), ref, rtol=1e-5, atol=1e-5)
    out16 = ops.decode_attention(q, k_cache, v_cache, positions, [0, 1], blocks, window, 0.125,
                                 True)
    _close_bf16(out16, ref.reshape(3, H * D))


def test_decode_attention_refuses_a_position_beyond_its_blocks():
    k = torch.zeros(4, 4, 1, 8)
    with pytest.raises(RuntimeError, match="beyond its 1 blocks"):
        ops.decode_attention(torch.zeros(1, 1, 8), k, k, torch.tensor([4]), [0],
                             [torch.tensor([[2]])], 0, 1.0, False)
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.decode_attention(torch.zeros(1, 1, 8), k, k, torch.tensor([1]), [0],
                             [torch.tensor([[9]])], 0, 1.0, False)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_act(gelu, dtype):
    """Against float64, gelu-tanh written as x * sigmoid(2y) (the same function): torch's
    0.5 x (1 + tanh(y)) rounds its far negative tail to exactly 0 (1 + tanh cancels), even in
    float64, where the kernel's form keeps the tiny value."""
    g = torch.Generator().manual_seed(4)
    gu = (torch.randn(4, 2 * 1536, generator=g) * 4).to(dtype)
    gate, up = gu.double()[:, :1536], gu.double()[:, 1536:]
    if gelu:
        y = 0.7978845608028654 * (gate + 0.044715 * gate ** 3)
        ref = gate * torch.sigmoid(2 * y) * up
        torch.testing.assert_close(ref, F.gelu(gate, approximate="tanh") * up)
    else:
        ref = F.silu(gate) * up
    torch.testing.assert_close(ops.gated_act(gu, 1536, gelu, False), ref.float(), rtol=1e-5,
                               atol=1e-6)
    _close_bf16(ops.gated_act(gu, 1536, gelu, True), ref.float())


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_KERNELS", "0")
    assert not kernels.enabled()
    monkeypatch.setenv("TIGHTFIT_KERNELS", "1")
    assert kernels.enabled()


def test_a_build_that_fails_leaves_decode_on_the_plain_stack(monkeypatch, tmp_path):
    """No compiler: load() says why and returns False (engine/scripted.py then builds the plain
    stack); the cached state is restored afterwards."""
    saved = dict(kernels._state)
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert kernels.load() is False
    assert "no C++ compiler" in kernels.why_not()
    monkeypatch.setattr(kernels, "_state", saved)


def test_tensors_off_the_cpu_are_refused():
    meta = torch.zeros(2, 8, device="meta")
    with pytest.raises(RuntimeError, match="CPU only"):
        ops.rms_norm_to(meta, torch.ones(8), 1e-5, False)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_fused_projection_with_awq_input_scales(kind):
    """The fused stack's projection applies activation-aware input scales in fp32 before any
    rounding, as the eager linears do: same output for the same fp32 input (and it asks the op
    before it for fp32, not bf16)."""
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear
    from tightfit.engine.scripted import _FLinear

    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 64, generator=g) * 0.05
    s = torch.rand(64, generator=g) * 3 + 0.25  # AWQ per-input-channel scales
    lin = (Int4Linear.from_float(w, 32, input_scale=s) if kind == "int4"
           else Int8Linear.from_float(w, input_scale=s))
    proj = torch.jit.script(_FLinear(lin))
    assert proj.in_bf16 is False
    x = torch.randn(3, 64, generator=g)
    assert torch.equal(proj(x).float(), lin(x))


@pytest.mark.parametrize("shape", [(1536, 576, 1), (9000, 96, 3), (100, 640, 300),
                                   (1536, 576, 700), (64, 32, 0)])
def test_int8x2_split_and_combine_equal_the_plain_int8x2_linear(shape, monkeypatch):
    """The fused split / join around fbgemm's int8 GEMM give the plain int8x2_linear's result
    bit for bit: rows of very different magnitude, several packed weight blocks, many rows
    (700: several row blocks, each split and joined across threads), and none. The eager module (the
    prefill path) takes the fused ops once the kernels are loaded."""
    from tightfit.engine.quant import linear

    out_f, in_f, m = shape
    if m == 3:  # force several packed output-row blocks
        monkeypatch.setattr(linear, "PACK_BLOCK_BYTES", linear._ROW_CHUNK * (in_f + 2))
    g = torch.Generator().manual_seed(7)
    lin = linear.Int8Linear.from_float(torch.randn(out_f, in_f, generator=g), None)
    assert m != 3 or len(lin.packed) > 1
    x = torch.randn(m, in_f, generator=g) * torch.logspace(-3, 3, m).unsqueeze(1)
    ref = linear.int8x2_linear(x, lin.packed, lin.levels)
    assert torch.equal(torch.jit.script(linear.int8x2_fused_linear)(x, lin.packed, lin.levels), ref)
    assert kernels.loaded() and torch.equal(lin(x), ref)


def test_int8x2_combine_refuses_mismatched_rows():
    with pytest.raises(RuntimeError, match="need twice as many"):
        torch.ops.tightfit.int8x2_combine(torch.ones(3, 4), torch.ones(1, 1), torch.ones(1, 1))


def test_the_build_directory_follows_the_source(monkeypatch, tmp_path):
    """Another kernel source builds elsewhere (never rebuilds or races this one's library), and
    the compiled file is a copy in the build directory, so touching the checkout's file (a fresh
    clone) does not make ninja rebuild."""
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    here = kernels.build_dir()
    other = tmp_path / "decode.cpp"
    other.write_text(kernels.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(kernels, "SOURCE", other)
    there = kernels.build_dir()
    assert here != there and here.parent == there.parent == tmp_path / "kernels"
    there.mkdir(parents=True)
    copy = kernels._source_copy(there)
    assert copy.parent == there and copy.read_text() == other.read_text()
