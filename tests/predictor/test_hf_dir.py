"""`model.path` on a Hugging Face directory: the shape from config.json, the parameters counted
in the safetensors headers. Real files written here with the safetensors library."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tightfit.predictor import memory
from tightfit.predictor.api import predict
from tightfit.predictor.scenario import parse_row

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _row(path: Path | str, **extra) -> dict:
    return {"id": "h", "hardware": {"name": "RTX 4090"}, "engine": "hf-transformers",
            "model": {"path": str(path)}, "workload": {"prompt_tokens": 64, "gen_tokens": 32},
            **extra}


def _write(d: Path, *, tied: bool = False, layers: int = 2, hidden: int = 64, heads: int = 4,
           kv: int = 2, inter: int = 128, vocab: int = 500, experts: int = 0, used: int = 0,
           config: dict | None = None, vision: bool = False) -> Path:
    d.mkdir()
    hd = hidden // heads
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float16)}
    if not tied:
        t["lm_head.weight"] = np.zeros((vocab, hidden), np.float16)
    for i in range(layers):
        pre = f"model.layers.{i}."
        t[pre + "self_attn.q_proj.weight"] = np.zeros((heads * hd, hidden), np.float16)
        t[pre + "self_attn.k_proj.weight"] = np.zeros((kv * hd, hidden), np.float16)
        t[pre + "self_attn.v_proj.weight"] = np.zeros((kv * hd, hidden), np.float16)
        t[pre + "self_attn.o_proj.weight"] = np.zeros((hidden, heads * hd), np.float16)
        t[pre + "input_layernorm.weight"] = np.zeros(hidden, np.float16)
        for e in range(experts) if experts else [None]:
            mlp = pre + (f"mlp.experts.{e}." if e is not None else "mlp.")
            for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                ("down_proj", (hidden, inter))):
                t[mlp + name + ".weight"] = np.zeros(shape, np.float16)
    if vision:
        t["vision_tower.encoder.weight"] = np.zeros((1000, 1000), np.float16)
    half = len(t) // 2  # two shards, as large checkpoints come
    keys = sorted(t)
    safetensors_numpy.save_file({k: t[k] for k in keys[:half]}, str(d / "model-1.safetensors"))
    safetensors_numpy.save_file({k: t[k] for k in keys[half:]}, str(d / "model-2.safetensors"))
    cfg = {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
           "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
           "vocab_size": vocab, "tie_word_embeddings": tied, "torch_dtype": "float16"}
    if experts:
        cfg.update(model_type="qwen3_moe", num_experts=experts, num_experts_per_tok=used,
                   moe_intermediate_size=inter)
    cfg.update(config or {})
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _params(d: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in d.glob("*.safetensors"):
        with safe_open(str(f), framework="np") as st:
            n += sum(int(np.prod(st.get_slice(k).get_shape())) for k in st.keys()
                     if "vision" not in k)
    return n


def test_a_directory_gives_its_shape_format_and_counted_parameters(tmp_path: Path) -> None:
    d = _write(tmp_path / "my-model", vision=True)
    s = parse_row(_row(d))
    m = s.model
    assert (m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.vocab_size, m.head_dim,
            m.intermediate_size) == (2, 64, 4, 2, 500, 16, 128)
    assert s.quant == "fp16" and not m.ties_embeddings and m.shape_known
    assert m.params_b * 1e9 == pytest.approx(_params(d))  # the vision tower left out
    # HF holds the checkpoint's fp16 weights: 2 bytes a parameter
    from tightfit.predictor import engines
    assert memory.weight_bytes(s, engines.for_scenario(s)) == pytest.approx(2 * _params(d))
    assert any("config.json (llama)" in n and "counted in its safetensors" in n for n in s.notes)
    # config.json itself names the directory too; a tied checkpoint has no lm_head
    assert parse_row(_row(d / "config.json")).model.params_b == m.params_b
    assert parse_row(_row(_write(tmp_path / "tied", tied=True))).model.ties_embeddings
    # HF quantises on load: another format is the row's choice
    assert parse_row(_row(d, quant="nf4")).quant == "nf4"
    # the trained context where config.json gives it
    assert m.trained_context == 0
    long = _write(tmp_path / "long", config={"max_position_embeddings": 4096})
    assert parse_row(_row(long)).model.trained_context == 4096


def test_a_mixture_of_experts_and_a_windowed_directory(tmp_path: Path) -> None:
    d = _write(tmp_path / "moe", experts=4, used=1, layers=2)
    m = parse_row(_row(d)).model
    experts = 2 * 4 * 3 * 128 * 64
    assert m.expert_params_b == pytest.approx(experts / 1e9)
    assert m.params_b - m.active_params_b == pytest.approx(experts * 3 / 4 / 1e9)
    w = _write(tmp_path / "win", layers=6, config={
        "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]})
    m = parse_row(_row(w)).model
    assert (m.sliding_window, m.window_layers) == (512, 5)
    h = _write(tmp_path / "hyb", layers=4, config={
        "model_type": "qwen3_next", "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    m = parse_row(_row(h)).model
    assert (m.mixer, m.kv_layers) == ("gated_deltanet", 1)


def test_a_quantised_checkpoint_counts_its_shape_not_its_packed_tensors(tmp_path: Path) -> None:
    d = _write(tmp_path / "gptq", config={"quantization_config": {"quant_method": "gptq",
                                                                  "bits": 4}})
    s = parse_row(_row(d))
    assert s.quant == "gptq"
    # embeddings x 2 + attention + gated FFN, as the config describes them
    want = 2 * 500 * 64 + 2 * 64 * (2 * 64 + 2 * 32) + 2 * 3 * 64 * 128
    assert s.model.params_b * 1e9 == pytest.approx(want)
    assert any("from its shape" in n for n in s.notes)


def test_bad_directories_are_row_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    thin = tmp_path / "thin"
    thin.mkdir()
    (thin / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for d, words in ((empty, "no config.json"),
                     (bad, "not readable JSON"), (thin, "lacks num_hidden_layers")):
        out = predict([_row(d)])[0]
        assert out["error"]["field"] == "model.path" and words in out["error"]["message"], out
    nodtype = _write(tmp_path / "nodtype", config={"torch_dtype": None})
    out = predict([_row(nodtype)])[0]
    assert out["error"]["field"] == "quant"
    assert "error" not in predict([_row(nodtype, quant="bf16")])[0]


def test_a_directory_saved_by_transformers_reads_as_transformers_counts_it(tmp_path) -> None:
    """A real checkpoint written by HF Transformers' save_pretrained (a small Qwen2, untied,
    and a tied one): the parameters read are the ones Transformers counts, the shape its
    config's."""
    transformers = pytest.importorskip("transformers")
    for tied in (False, True):
        cfg = transformers.Qwen2Config(
            vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
        model = transformers.Qwen2ForCausalLM(cfg)
        out = tmp_path / f"qwen2-tied-{tied}"
        model.save_pretrained(out)
        m = parse_row(_row(out)).model
        assert m.params_b * 1e9 == model.num_parameters()
        assert (m.n_layers, m.n_kv_heads, m.head_dim, m.ties_embeddings) == (3, 2, 16, tied)


def test_a_gemma_4_config_gives_its_full_layers_their_own_k_v(tmp_path: Path) -> None:
    """Gemma 4's config names its full-attention layers' K/V heads and their size apart
    (num_global_key_value_heads, global_head_dim): their K/V a token against a window
    layer's."""
    d = _write(tmp_path / "g4", layers=6, heads=4, kv=2, config={
        "model_type": "gemma4_text", "head_dim": 16, "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "num_global_key_value_heads": 1, "global_head_dim": 16})
    m = parse_row(_row(d)).model
    assert (m.window_layers, m.full_kv_scale) == (5, 0.5)


def test_a_hybrid_config_gives_its_recurrent_state(tmp_path: Path) -> None:
    """Qwen3-Next's config: Gated DeltaNet layers by `layer_types`, their state from the
    linear_* heads; a Mamba-2 hybrid's (Granite 4.0-H) from its mamba_* keys."""
    from tightfit.predictor import architectures

    d = _write(tmp_path / "qn", layers=4, config={
        "model_type": "qwen3_next", "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4})
    m = parse_row(_row(d)).model
    assert m.state_bytes_per_layer == architectures.gated_deltanet_state(32, 16, 128, 128, 4)
    g = _write(tmp_path / "gh", layers=4, config={
        "model_type": "granitemoehybrid", "layer_types": ["mamba"] * 3 + ["attention"],
        "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_d_conv": 4})
    m = parse_row(_row(g)).model
    assert (m.mixer, m.kv_layers) == ("mamba2", 1)
    assert m.state_bytes_per_layer == architectures.mamba_state(64, 128, True, 2, 1, 4)
