"""`tightfit quantize` -> .tfq -> load: identical logits to quantising on load (plain int4, and a
mixed AWQ plan with split groups, run-time scales, int8, fp32 and native parts); damaged files and
wrong arguments fail with one line naming the file or value.

The AWQ round trip calibrates two layers on 2 sequences x 128 tokens without clipping (the
default is 64 x 512 with clipping) in a private cache directory, to stay fast."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tightfit.engine.quant.awq_model as awq_model
from tightfit.cli.main import main
from tightfit.engine.quant.awq_model import CalibrationSettings
from tightfit.errors import ModelFileError, TightfitError

MIXED_PLAN = """\
default: int4-g64
rules:
  "layers.[23].*": int4-awq-g64   # AWQ on two layers only: keeps the calibration short
  k_proj: native          # stored Q4_1 blocks: q/v must scale their input at run time
  gate_proj: fp32
  "layers.0.*": int8
  lm_head: int8
"""


def _logits(llm, n: int = 48) -> torch.Tensor:
    from tightfit.engine.scoring import corpus_windows, window_logits

    return window_logits(llm, corpus_windows(llm.tokenizer, 1)[0][:n])


@pytest.fixture(scope="module")
def int4_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tfq") / "model.tfq"
    assert main(["quantize", "--quant", "int4-g64", "--output", str(out), "--threads", "2"]) == 0
    return out


def test_int4_round_trip_gives_identical_logits(int4_file: Path, capsys) -> None:
    from tightfit import LLM

    on_load = LLM(quant="int4-g64", num_threads=2)
    from_file = LLM(str(int4_file), num_threads=2)
    assert from_file.loaded.weight_format == "int4-g64"
    assert torch.equal(_logits(on_load), _logits(from_file))
    out = from_file.generate(["The capital of France is"])[0]
    assert out.token_ids == on_load.generate(["The capital of France is"])[0].token_ids


def test_mixed_awq_plan_round_trip(tmp_path: Path, monkeypatch) -> None:
    from tightfit import LLM
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear
    from tightfit.engine.quant.plan import SplitLinear

    monkeypatch.setenv("TIGHTFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(awq_model, "DEFAULT_CALIBRATION",
                        CalibrationSettings(sequences=2, tokens=128, search_tokens=256,
                                            clip="none"))
    plan = tmp_path / "plan.yaml"
    plan.write_text(MIXED_PLAN)
    out = tmp_path / "mixed.tfq"
    assert main(["quantize", "--quant", str(plan), "--output", str(out), "--threads", "2"]) == 0
    on_load = LLM(quant=str(plan), num_threads=2)  # replays the calibration from the cache
    from_file = LLM(str(out), num_threads=2)
    layer = from_file.loaded.model.layers[3]
    q, k, v = layer.attn.qkv.parts
    assert isinstance(layer.attn.qkv, SplitLinear) and isinstance(k, Int4Linear)
    assert q.input_scale_inv is not None and k.input_scale_inv is None
    assert isinstance(layer.mlp.gate_up.parts[0], torch.nn.Linear)
    assert isinstance(from_file.loaded.model.layers[0].attn.qkv, Int8Linear)
    assert isinstance(from_file.loaded.model.lm_head, Int8Linear)
    assert torch.equal(_logits(on_load), _logits(from_file))


def _damaged(src: Path, dst: Path, how: str) -> Path:
    data = bytearray(src.read_bytes())
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "flipped":
        data[-1000] ^= 0xFF  # inside the last tensor: only the checksum can tell
    else:
        data = bytearray(b"not a model at all" * 10)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage"])
def test_damaged_file_is_a_clear_error(int4_file: Path, tmp_path: Path, how: str, capsys) -> None:
    from tightfit.engine.loader.quantized import load_quantized

    bad = _damaged(int4_file, tmp_path / f"{how}.tfq", how)
    with pytest.raises(ModelFileError, match=str(bad)):
        load_quantized(bad)
    assert main(["generate", "hi", "--model", str(bad), "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


def test_file_is_already_quantised(int4_file: Path) -> None:
    from tightfit.engine.loader.quantized import load_quantized

    with pytest.raises(TightfitError, match="int8"):
        load_quantized(int4_file, "int8")


@pytest.mark.parametrize("argv, needle", [
    (["quantize", "--quant", "int4-g64", "--output", "x.bin"], "x.bin"),
    (["quantize", "--quant", "int5", "--output", "x.tfq"], "int5"),
    (["quantize", "--quant", "int4-g48", "--output", "x.tfq"], "48"),
])
def test_bad_arguments_are_one_line(argv: list[str], needle: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_hf_directory_round_trip_with_awq(tmp_path: Path, monkeypatch) -> None:
    """An HF-layout source (fp32 safetensors, untied head, byte tokenizer referenced by path):
    AWQ from fp32 weights, the fp32 embedding stored as is, the same logits after loading."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tightfit import LLM

    src = tmp_path / "hf"
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(src, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({chr(i): i for i in range(32, 128)} | {"<unk>": 0},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(src / "tokenizer.json"))
    monkeypatch.setenv("TIGHTFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(awq_model, "DEFAULT_CALIBRATION",
                        CalibrationSettings(sequences=2, tokens=64, search_tokens=128))
    out = tmp_path / "tiny.tfq"
    assert main(["quantize", "--model", str(src), "--quant", "int4-awq-g32", "--output",
                 str(out), "--threads", "1"]) == 0
    on_load = LLM(str(src), quant="int4-awq-g32", num_threads=1, block_size=4)
    from_file = LLM(str(out), num_threads=1, block_size=4)
    ids = from_file.tokenizer.encode("def f(x): return x")
    from tightfit.engine.scoring import window_logits

    assert torch.equal(window_logits(on_load, ids), window_logits(from_file, ids))
    assert isinstance(from_file.loaded.model.embed, torch.nn.Embedding)
