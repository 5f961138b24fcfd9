"""GGUF 4-bit blocks run as int4 without re-quantising: exact against gguf's own dequantiser."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tightfit.engine.quant.gguf_native import (
    gguf_int4_weights, int4_linear_from_gguf_q4, linear_from_gguf, native_weight_format)
from tightfit.engine.quant.linear import Int4Linear, Int8Linear
from tightfit.engine.quant.reference import dequantize_int4, reference_linear
from tightfit.errors import ModelFileError, UnsupportedModelError

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def _gguf_reference(raw: np.ndarray, qtype: object, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float32))


@pytest.fixture(scope="module")
def default_layer0() -> list:
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.resolve import resolve_model

    try:
        path = resolve_model(None)
    except Exception as exc:  # the embedded model is an install-time extra
        pytest.skip(f"default model not installed: {exc}")
    return [t for t in GGUFFile(path).tensors()
            if t.name.startswith("blk.0.") and len(t.shape) == 2]


def test_default_model_q4_1_is_exact(default_layer0: list) -> None:
    assert {t.qtype.name for t in default_layer0} == {"Q4_1"}
    assert len(default_layer0) == 7  # q, k, v, o, gate, up, down
    x = torch.randn(5, 1536, generator=torch.Generator().manual_seed(0))
    for t in default_layer0:
        ref_w = _gguf_reference(t.data, t.qtype, t.shape)
        qw = gguf_int4_weights(t.data, t.qtype, t.shape)
        # Q4_1 (d*q + m) as (q - 8)*d + (m + 8d): the same real value, rounded once -> bit-exact.
        assert torch.equal(dequantize_int4(qw), ref_w), t.name
        xk = x[:, :t.shape[1]]
        exact = int4_linear_from_gguf_q4(t.data, t.qtype, t.shape, compute="fp32")(xk)
        ref = F.linear(xk, ref_w)
        assert float((exact - ref).abs().max() / ref.abs().max()) < 1e-5, t.name
        fast = int4_linear_from_gguf_q4(t.data, t.qtype, t.shape)(xk)
        torch.testing.assert_close(fast, reference_linear(xk, qw, compute="bf16"),
                                   rtol=2.0 ** -7, atol=1e-6 * float(ref.abs().max()))
        # bf16 input/scales/output cost well under 1% of the output.
        assert float((fast - ref).norm() / ref.norm()) < 0.006, t.name


def _random_blocks(qtype: object, n_blocks: int, f16_fields: tuple[int, ...],
                   seed: int = 0) -> np.ndarray:
    """Random code bytes with sane fp16 scale fields at the given byte offsets."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in f16_fields:
        vals = (rng.uniform(1e-3, 5e-2, n_blocks) * rng.choice([-1, 1], n_blocks))
        blocks[:, off:off + 2] = vals.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


@pytest.mark.parametrize("qtype,f16_fields,shape", [
    (T.Q4_0, (0,), (48, 256)),
    (T.Q4_1, (0, 2), (48, 256)),
    (T.Q4_K, (0, 2), (48, 512)),
])
def test_random_blocks_match_gguf(qtype: object, f16_fields: tuple[int, ...],
                                  shape: tuple[int, int]) -> None:
    values = gguf.GGML_QUANT_SIZES[qtype][0]
    raw = _random_blocks(qtype, shape[0] * shape[1] // values, f16_fields)
    ref_w = _gguf_reference(raw, qtype, shape)
    qw = gguf_int4_weights(raw, qtype, shape)
    torch.testing.assert_close(dequantize_int4(qw), ref_w, rtol=0,
                               atol=1e-7 * float(ref_w.abs().max()))
    x = torch.randn(3, shape[1], generator=torch.Generator().manual_seed(1))
    y = int4_linear_from_gguf_q4(raw, qtype, shape, compute="fp32")(x)
    ref = F.linear(x, ref_w)
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5


def test_q4_0_from_gguf_quantiser_is_bit_exact() -> None:
    w = np.random.default_rng(0).standard_normal((32, 128)).astype(np.float32)
    raw = gguf.quants.quantize(w, T.Q4_0)
    assert torch.equal(dequantize_int4(gguf_int4_weights(raw, T.Q4_0, (32, 128))),
                       _gguf_reference(raw, T.Q4_0, (32, 128)))


def test_row_permutation_and_qtype_spellings() -> None:
    raw = _random_blocks(T.Q4_1, 32 * 64 // 32, (0, 2))
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    ref_w = _gguf_reference(raw, T.Q4_1, (32, 64))[perm]
    for qtype in (T.Q4_1, "Q4_1", "q4_1", int(T.Q4_1)):
        qw = gguf_int4_weights(raw, qtype, (32, 64), row_perm=perm)
        assert torch.equal(dequantize_int4(qw), ref_w)


def test_native_policy() -> None:
    assert native_weight_format(T.Q4_1).name == "int4-g32"
    assert native_weight_format("Q4_K").name == "int4-g32"
    assert native_weight_format(T.F16).name == "fp32"
    assert native_weight_format(T.Q8_0).name == "int8"
    assert native_weight_format(T.Q6_K).name == "int8"
    raw = _random_blocks(T.Q4_0, 16 * 64 // 32, (0,))
    assert isinstance(linear_from_gguf(raw, T.Q4_0, (16, 64)), Int4Linear)
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    q8 = linear_from_gguf(gguf.quants.quantize(w, T.Q8_0), T.Q8_0, (16, 64))
    assert isinstance(q8, Int8Linear)
    f32 = linear_from_gguf(w, T.F32, (16, 64))
    assert torch.equal(f32.weight, torch.from_numpy(w))


def test_bad_tensors_are_named() -> None:
    raw = _random_blocks(T.Q4_1, 16 * 64 // 32, (0, 2))
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_q.*corrupt"):
        gguf_int4_weights(raw[:-1], T.Q4_1, (16, 64), name="blk.0.attn_q.weight")
    with pytest.raises(ModelFileError, match="Q4_1"):
        gguf_int4_weights(raw, T.Q4_1, (16, 48))  # 48 is not a whole number of blocks
    with pytest.raises(UnsupportedModelError, match=r"Q8_0.*Q4_0, Q4_1, Q4_K"):
        gguf_int4_weights(raw, T.Q8_0, (16, 64))
    with pytest.raises(UnsupportedModelError, match="9999"):
        native_weight_format(9999)
