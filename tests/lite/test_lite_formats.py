"""GGUF re-typing (`tightfit quantize -o x.gguf`, `default:<TYPE>` names) and the lite runtime on
the re-typed files: the copy holds the same model (metadata, tokenizer, each weight as the source
dequantises it, rounded only by the new type), and the lite runtime's float and Q8_0 paths on it
agree with the torch engine's fp32 model."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tightfit.engine.loader.resolve import resolve_model


@pytest.fixture(scope="module")
def f16_copy() -> Path:
    return resolve_model("default:F16")


def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(path))


def test_a_retyped_copy_holds_the_same_model(f16_copy: Path) -> None:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    src, dst = _reader(resolve_model(None)), _reader(f16_copy)
    skip = {"general.file_type"}
    keys = {k for k in src.fields if not k.startswith("GGUF.")} - skip
    assert keys == {k for k in dst.fields if not k.startswith("GGUF.")} - skip
    assert src.fields["tokenizer.ggml.tokens"].contents() == \
        dst.fields["tokenizer.ggml.tokens"].contents()
    assert dst.fields["general.file_type"].contents() == 1  # MOSTLY_F16
    out = {t.name: t for t in dst.tensors}
    assert set(out) == {t.name for t in src.tensors}
    for t in src.tensors:
        o = out[t.name]
        want = quants.dequantize(t.data, t.tensor_type)
        if len(want.shape) == 1:
            assert o.tensor_type == T.F32
            np.testing.assert_array_equal(o.data, want)
        else:
            assert o.tensor_type == T.F16
            np.testing.assert_array_equal(o.data, want.astype(np.float16))


def test_retyping_rules_for_4_bit_targets(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as T

    from tightfit.engine.loader.convert import convert

    done = convert(resolve_model(None), tmp_path / "q40.gguf", "q4_0")
    types = {t.name: t.tensor_type for t in _reader(tmp_path / "q40.gguf").tensors}
    assert types["token_embd.weight"] == T.Q8_0  # the embedding keeps 8 bits, as in the source
    assert types["blk.0.attn_q.weight"] == T.Q4_0 and types["blk.0.attn_norm.weight"] == T.F32
    assert done["tensors"] == {"Q4_0": 210, "Q8_0": 1, "F32": 61}


def _ppl_and_top1(model: Any, ids: list[int], ref: Any) -> tuple[float, float]:
    n = len(ids)
    logits = model.forward(ids, [0] * n, range(n), range(n - 1)).astype(np.float64)
    model.release(0)
    z = logits - logits.max(axis=1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=1)) - z[np.arange(n - 1), ids[1:]]
    return math.exp(nll.mean()), float((logits.argmax(axis=1) == ref.top1.numpy()).mean())


@pytest.mark.parametrize("tag, ppl_tol, top1", [("F16", 0.001, 0.99), ("Q8_0", 0.01, 0.93)])
def test_lite_on_a_retyped_copy_agrees_with_the_fp32_engine(default_llm: Any, tag: str,
                                                            ppl_tol: float, top1: float) -> None:
    """F16: the float path (F16C-widened weights, float activations) on the dequantised weights
    themselves, so only half K/V and summation order separate it from fp32. Q8_0: activations
    rounded to int8 as for the 4-bit types, weights to 8 bits."""
    from tightfit.engine import scoring
    from tightfit.lite import LiteModel

    model = LiteModel(resolve_model(f"default:{tag}"), threads=2, max_model_len=512,
                      max_num_seqs=1)
    ids = scoring.corpus_windows(model.tokenizer, windows=1)[0]
    ref = scoring.score_tokens(default_llm, ids)
    ref_ppl = math.exp(float(ref.nll.numpy().mean()))
    ppl, agree = _ppl_and_top1(model, ids, ref)
    assert abs(ppl / ref_ppl - 1) < ppl_tol, (ppl, ref_ppl)
    assert agree >= top1, agree


def test_a_tagged_name_is_converted_once(f16_copy: Path) -> None:
    before = f16_copy.stat().st_mtime_ns
    assert resolve_model("smollm2:f16") == f16_copy
    assert f16_copy.stat().st_mtime_ns == before


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tightfit", "quantize", *args],
                          capture_output=True, text=True, timeout=300)


def test_the_cli_writes_a_gguf_and_names_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "smol.Q8_0.gguf"
    r = _cli("--quant", "Q8_0", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "Q8_0" in r.stdout and out.stat().st_size > 100e6
    assert not list(tmp_path.glob(".*.tmp"))
    bad = [(("--quant", "Q5_K", "-o", str(tmp_path / "a.gguf")), "Q5_K"),
           (("--quant", "Q8_0", "-o", str(tmp_path / "a.tfq")), ".gguf"),
           (("--model", str(out), "--quant", "F16", "-o", str(out)), "input file"),
           (("--model", str(tmp_path / "none.gguf"), "--quant", "F16", "-o",
             str(tmp_path / "b.gguf")), "none.gguf")]
    for args, needle in bad:
        r = _cli(*args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "a.gguf").exists() and not (tmp_path / "b.gguf").exists()


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    from tightfit.engine.loader.convert import convert
    from tightfit.errors import TightfitError

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 100)
    with pytest.raises(TightfitError, match="junk.gguf"):
        convert(junk, tmp_path / "out.gguf", "F16")
    assert not (tmp_path / "out.gguf").exists()
