"""The lite runtime's matrix kernels on their own (`tf_linear`) against numpy references, for
every stored type it reads, in the SIMD build and the plain-C build: exactly the reference that
quantises activations the same way (int8 per 32 values), and within that quantisation's error of
the float product with the dequantised weights. Row and token counts cover the four-row path and
its remainder."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tightfit.lite.runtime import library

ROWS, COLS = 37, 96
rng = np.random.default_rng(0)


def _blocks(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored bytes [ROWS, row_bytes], dequantised weights [ROWS, COLS])."""
    nb = COLS // 32
    d = (rng.random((ROWS, nb)) * 0.02 + 0.001).astype(np.float16)
    if kind == "Q8_0":
        q = rng.integers(-128, 128, (ROWS, nb, 32)).astype(np.int8)
        raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=-1)
        w = d.astype(np.float32)[..., None] * q
    else:
        q = rng.integers(0, 16, (ROWS, nb, 32)).astype(np.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        if kind == "Q4_1":
            m = (rng.standard_normal((ROWS, nb)) * 0.05).astype(np.float16)
            raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8),
                                  packed], axis=-1)
            w = d.astype(np.float32)[..., None] * q + m.astype(np.float32)[..., None]
        else:  # Q4_0
            raw = np.concatenate([d[..., None].view(np.uint8), packed], axis=-1)
            w = d.astype(np.float32)[..., None] * (q.astype(np.float32) - 8)
    return np.ascontiguousarray(raw.reshape(ROWS, -1)), w.reshape(ROWS, COLS)


def _quantised(x: np.ndarray) -> np.ndarray:
    """Activations as the kernels see them: int8 per 32 values, scale amax / 127."""
    b = x.reshape(len(x), -1, 32).astype(np.float32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
    q = np.rint(b / np.where(d > 0, d, 1)).clip(-127, 127)
    return (q * d).reshape(x.shape).astype(np.float64)


TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


@pytest.mark.parametrize("march", [None, "haswell", "x86-64"], ids=["native", "avx2", "plain-c"])
@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_kernel_matches_the_reference(march: str | None, kind: str, n: int) -> None:
    lib = library(march)
    if kind == "F32":
        w = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        raw = w
    elif kind == "F16":
        raw = rng.standard_normal((ROWS, COLS)).astype(np.float16)
        w = raw.astype(np.float32)
    else:
        raw, w = _blocks(kind)
    x = rng.standard_normal((n, COLS)).astype(np.float32)
    y = np.empty((n, ROWS), dtype=np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    rc = lib.tf_linear(TYPES[kind], ROWS, COLS, raw.ctypes.data, n,
                       x.ctypes.data_as(fp), y.ctypes.data_as(fp), 2)
    assert rc == 0
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    if kind in ("F32", "F16"):
        np.testing.assert_allclose(y, exact, rtol=1e-4, atol=1e-4)
        return
    same_math = _quantised(x) @ w.T.astype(np.float64)
    np.testing.assert_allclose(y, same_math, rtol=1e-4, atol=1e-4 * np.abs(same_math).max())
    assert np.abs(y - exact).max() < 0.03 * np.abs(exact).max()


def test_bad_shapes_are_refused() -> None:
    lib = library()
    x = np.zeros((1, 40), dtype=np.float32)
    y = np.zeros((1, 4), dtype=np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    raw = np.zeros((4, 40), dtype=np.uint8)
    assert lib.tf_linear(3, 4, 40, raw.ctypes.data, 1, x.ctypes.data_as(fp),
                         y.ctypes.data_as(fp), 1) == -1  # 40 is not whole 32-value blocks
    assert lib.tf_linear(5, 4, 32, raw.ctypes.data, 1, x.ctypes.data_as(fp),
                         y.ctypes.data_as(fp), 1) == -1  # type 5 (Q5_0) is not read


@pytest.mark.parametrize("march", [None, "x86-64"], ids=["native", "plain-c"])
@pytest.mark.parametrize("kind", ["F32", "F16"])
@pytest.mark.parametrize("cols", [44, 109])
def test_float_rows_of_any_width(march: str | None, kind: str, cols: int) -> None:
    """Float weights need not come in 32-value blocks: the vector loops' 8-wide steps and the
    scalar tail after them, one token and four."""
    lib = library(march)
    fp = ctypes.POINTER(ctypes.c_float)
    w = rng.standard_normal((ROWS, cols)).astype(np.float32)
    raw = w if kind == "F32" else w.astype(np.float16)
    for n in (1, 4, 5):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y = np.empty((n, ROWS), dtype=np.float32)
        assert lib.tf_linear(TYPES[kind], ROWS, cols, raw.ctypes.data, n,
                             x.ctypes.data_as(fp), y.ctypes.data_as(fp), 2) == 0
        np.testing.assert_allclose(y, x.astype(np.float64) @ raw.astype(np.float64).T,
                                   rtol=1e-4, atol=1e-4)


def test_the_kernel_probe_measures_a_rate_and_is_none_without_a_compiler(tmp_path, monkeypatch):
    """`measure_kernel_gflops` times the Q4_0 kernel (the bench's run probe and `tightfit
    calibrate` record it); where the library cannot be built, or its block kernels are plain C,
    it says so with None, not an error."""
    from tightfit.bench.fingerprint import measure_kernel_gflops, measure_kernel_stream_gbps
    from tightfit.lite.runtime import SIMD

    if SIMD[library().tf_simd()] == "avx512-vnni":
        rate = measure_kernel_gflops(1, seconds=0.02)
        assert rate is not None and 0.5 < rate < 5000
        # the same kernel streaming a 143 MB Q8_0 matrix: GB/s of matrix bytes
        stream = measure_kernel_stream_gbps(1, seconds=0.02)
        assert stream is not None and 0.1 < stream < 2000
    # an AVX2-only build's block kernels are plain C: no figure rather than a misleading one
    assert measure_kernel_gflops(1, seconds=0.02, march="haswell") is None
    assert measure_kernel_stream_gbps(1, seconds=0.02, march="haswell") is None
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setenv("CC", "no-such-compiler")
    assert measure_kernel_gflops(1, seconds=0.02) is None
    assert measure_kernel_stream_gbps(1, seconds=0.02) is None
