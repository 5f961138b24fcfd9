"""Checks tightfit's torch dequantiser bit-for-bit against gguf's numpy reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as reference_dequantize

import tightfit.engine.loader.dequant as dequant_mod
from tightfit.engine.loader.dequant import SUPPORTED_TYPES, dequantize
from tightfit.errors import ModelFileError, TightfitError, UnsupportedModelError

# Byte offsets of the fp16 fields (scales / mins) inside one block of each block type.
FP16_FIELDS: dict[T, tuple[int, ...]] = {
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
BLOCK_TYPES = sorted(FP16_FIELDS, key=lambda t: t.value)


def random_blocks(qtype: T, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Random raw data for a (rows, blocks_per_row * block_size) tensor, as gguf's reader yields
    it: every byte random except the fp16 fields, which get finite values of either sign."""
    rng = np.random.default_rng(seed)
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, type_size)
    for offset in FP16_FIELDS[qtype]:
        values = rng.uniform(-3.0, 3.0, size=(blocks.shape[0], 1)).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8)
    return raw


def reference(data: np.ndarray, qtype: T, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.array(reference_dequantize(data, qtype), dtype=np.float32)).reshape(
        shape
    )


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == torch.float32
    assert actual.shape == expected.shape
    # torch.equal is also False for NaN == NaN, so a NaN anywhere fails loudly
    if not torch.equal(actual, expected):
        diff = (actual - expected).abs()
        raise AssertionError(
            f"{int((diff != 0).sum())} of {diff.numel()} values differ, max abs diff "
            f"{diff.max().item()} at flat index {int(diff.argmax())}"
        )


def test_block_types_covered() -> None:
    assert set(BLOCK_TYPES) | {T.F32, T.F16, T.BF16} == set(SUPPORTED_TYPES)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_type_matches_reference(qtype: T) -> None:
    block_size, _ = GGML_QUANT_SIZES[qtype]
    data = random_blocks(qtype, rows=24, blocks_per_row=5)
    shape = (24, 5 * block_size)
    assert_same(dequantize(data, qtype, shape), reference(data, qtype, shape))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_type_matches_reference_across_chunks(
    qtype: T, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk of 3 blocks over 7 x 2 blocks: several full chunks plus a ragged last one.
    block_size, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr(dequant_mod, "_CHUNK_VALUES", 3 * block_size)
    data = random_blocks(qtype, rows=7, blocks_per_row=2, seed=1)
    shape = (7, 2 * block_size)
    assert_same(dequantize(data, qtype, shape), reference(data, qtype, shape))


def test_3d_shape_and_extreme_fp16_scales() -> None:
    data = random_blocks(T.Q4_K, rows=6, blocks_per_row=1, seed=2)
    blocks = data.reshape(-1, GGML_QUANT_SIZES[T.Q4_K][1])
    # largest finite and smallest subnormal fp16 values for d and dmin
    blocks[0, 0:2] = np.array([65504.0], dtype=np.float16).view(np.uint8)
    blocks[1, 2:4] = np.array([2.0**-24], dtype=np.float16).view(np.uint8)
    expected = reference(data, T.Q4_K, (2, 3, 256))
    assert_same(dequantize(data, T.Q4_K, (2, 3, 256)), expected)


def test_f32_is_copied_not_aliased() -> None:
    src = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    src.setflags(write=False)  # like a read-only memory map
    out = dequantize(src, T.F32, (4, 8))
    assert_same(out, reference(src, T.F32, (4, 8)))
    out += 1.0
    assert np.array_equal(src + 1.0, out.numpy())


def test_f16_matches_reference() -> None:
    rng = np.random.default_rng(4)
    src = (rng.standard_normal((5, 16)) * 100).astype(np.float16)
    src[0, :3] = [65504.0, 2.0**-24, -0.0]
    assert_same(dequantize(src, T.F16, (5, 16)), reference(src, T.F16, (5, 16)))


def test_bf16_raw_bytes_match_reference() -> None:
    # gguf's reader yields BF16 tensors as uint8, two bytes per value
    rng = np.random.default_rng(5)
    values = (rng.standard_normal(48) * 1e3).astype(np.float32)
    raw = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(3, 32)
    assert_same(dequantize(raw, T.BF16, (3, 16)), reference(raw, T.BF16, (3, 16)))


def test_unsupported_type_names_type_tensor_and_supported_types() -> None:
    with pytest.raises(UnsupportedModelError) as info:
        dequantize(np.zeros(66, dtype=np.uint8), T.IQ2_XXS, (256,), name="blk.0.ffn_up.weight")
    message = str(info.value)
    assert "IQ2_XXS" in message
    assert "blk.0.ffn_up.weight" in message
    for qtype in SUPPORTED_TYPES:
        assert qtype.name in message
    assert isinstance(info.value, TightfitError)


def test_size_mismatch_is_a_model_file_error() -> None:
    data = random_blocks(T.Q8_0, rows=2, blocks_per_row=1)
    with pytest.raises(ModelFileError, match="Q8_0"):
        dequantize(data, T.Q8_0, (2, 64))
    with pytest.raises(ModelFileError):
        dequantize(data, T.Q8_0, (2, 33))


# ---------------------------------------------------------------------------------------------
# real model files: every tensor, large ones through a head and a tail slice of whole rows

_MAX_VALUES_PER_SLICE = 1 << 16


def _check_model(model: str | None, expected_types: set[str]) -> None:
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.resolve import resolve_model

    try:
        path = resolve_model(model)
    except ModelFileError as exc:
        pytest.skip(str(exc))
    seen: set[str] = set()
    for tensor in GGUFFile(path).tensors():
        seen.add(tensor.qtype.name)
        data, shape = tensor.data, tensor.shape
        if len(shape) >= 2 and np.prod(shape) > 2 * _MAX_VALUES_PER_SLICE:
            rows = data.reshape(-1, data.shape[-1])
            take = max(1, _MAX_VALUES_PER_SLICE // shape[-1])
            slices = [rows[:take], rows[-take:]]
        else:
            slices = [data]
        for part in slices:
            part_shape = shape if part is data else (part.shape[0], shape[-1])
            actual = dequantize(part, tensor.qtype, part_shape, name=tensor.name)
            try:
                assert_same(actual, reference(part, tensor.qtype, part_shape))
            except AssertionError as exc:
                raise AssertionError(f"{tensor.name} ({tensor.qtype.name}): {exc}") from None
    assert expected_types <= seen


def test_default_model_tensors_match_reference() -> None:
    _check_model(None, {"Q4_1", "Q8_0", "F32"})


def test_gemma3_tensors_match_reference() -> None:
    _check_model("gemma3", {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"})
