"""Loaders: HF-layout directories (safetensors) for each supported architecture against HF
Transformers on tiny random models, and clear errors for missing, corrupt or unsupported files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tightfit.engine.scoring import window_logits
from tightfit.errors import ModelFileError, UnsupportedModelError

transformers = pytest.importorskip("transformers")


def _byte_tokenizer(path: Path, vocab: int) -> None:
    """A minimal tokenizer.json (one token per byte) so the directory is a complete model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_vocab = {f"<{i}>": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(byte_vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(path / "tokenizer.json"))


def _tiny(kind: str):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=True)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "llama-untied":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False, rope_theta=50000.0)
        cls = transformers.LlamaForCausalLM
    else:  # gemma3 with a tiny sliding window, so sliding masks are exercised at short lengths
        cfg = transformers.Gemma3TextConfig(
            **common, head_dim=16, sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        cls = transformers.Gemma3ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # random norms so a wrong (1 + w) convention would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
    return model


@pytest.mark.parametrize("kind", ["qwen2", "llama-untied", "gemma3"])
def test_hf_directory_matches_transformers(tmp_path, kind):
    from tightfit import LLM, SamplingParams

    hf = _tiny(kind)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    _byte_tokenizer(tmp_path, 128)
    llm = LLM(str(tmp_path), quant="fp32", num_threads=1, block_size=4)
    assert llm.loaded.config.architecture == ("gemma3" if kind == "gemma3" else "llama")
    ids = [(7 * i + 3) % 128 for i in range(13)]
    ours = window_logits(llm, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel < 1e-5, f"{kind}: relative error {rel:.2e}"
    # greedy decoding through the paged cache (decode path, sliding masks) agrees with HF
    out = llm.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    with torch.no_grad():
        gen = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert out.token_ids == gen[0, len(ids):].tolist()


def test_missing_model_file_names_the_path():
    from tightfit import LLM

    with pytest.raises(ModelFileError, match="no-such-model.gguf"):
        LLM("/tmp/no-such-model.gguf")


def test_corrupt_and_truncated_gguf(tmp_path):
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.resolve import resolve_model

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 100)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFile(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(resolve_model(None).read_bytes()[:4_000_000])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(cut)


def test_unsupported_architecture_is_named(tmp_path):
    import gguf
    import numpy as np

    from tightfit import LLM

    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'bert'"):
        LLM(str(path))


def test_directory_without_config(tmp_path):
    from tightfit import LLM

    with pytest.raises(ModelFileError, match="config.json"):
        LLM(str(tmp_path))


def test_unknown_weight_format_named():
    from tightfit import LLM
    from tightfit.errors import TightfitError

    with pytest.raises(TightfitError, match="int3"):
        LLM(quant="int3")
