"""`model.path`: a local GGUF file's header gives the predictor the model's shape and the bytes
its tensors take. Real files through gguf's reader: the packaged Gemma 3 270M, and small files
written here with gguf's writer (a grouped-query model with an untied head, a mixture of
experts)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tightfit.predictor import engines, memory
from tightfit.predictor.api import predict
from tightfit.predictor.scenario import RowError, parse_row

gguf = pytest.importorskip("gguf")
Q8 = gguf.GGMLQuantizationType.Q8_0
F16 = gguf.GGMLQuantizationType.F16


def _row(path: str, **extra) -> dict:
    return {"id": "f", "hardware": {"name": "RTX 4090"}, "engine": "llama.cpp",
            "model": {"path": path}, "workload": {"prompt_tokens": 64, "gen_tokens": 32},
            **extra}


def _tensor_bytes(path: str | Path) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def _write(path: Path, *, layers: int = 3, hidden: int = 256, heads: int = 8, kv: int = 2,
           ffn: int = 512, vocab: int = 1000, experts: int = 0, used: int = 0,
           file_type: int = 7) -> Path:
    """A llama-architecture file: Q8_0 matrices, an F16 token embedding, an untied Q8_0 head."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_file_type(file_type)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(used)

    def q8(name: str, shape: tuple[int, ...]) -> None:
        data = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, Q8), raw_dtype=Q8)

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float16))
    q8("output.weight", (vocab, hidden))
    head_dim = hidden // heads
    for i in range(layers):
        q8(f"blk.{i}.attn_q.weight", (hidden, hidden))
        q8(f"blk.{i}.attn_k.weight", (kv * head_dim, hidden))
        q8(f"blk.{i}.attn_v.weight", (kv * head_dim, hidden))
        q8(f"blk.{i}.attn_output.weight", (hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        if experts:
            q8(f"blk.{i}.ffn_gate_exps.weight", (experts, ffn, hidden))
            q8(f"blk.{i}.ffn_up_exps.weight", (experts, ffn, hidden))
            q8(f"blk.{i}.ffn_down_exps.weight", (experts, hidden, ffn))
            q8(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden))
        else:
            q8(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
            q8(f"blk.{i}.ffn_up.weight", (ffn, hidden))
            q8(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_written_file_gives_its_shape_format_and_exact_weight_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path / "my-own-model.gguf")
    s = parse_row(_row(str(path)))
    m = s.model
    assert (m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.vocab_size,
            m.intermediate_size, m.head_dim) == (3, 256, 8, 2, 1000, 512, 32)
    assert not m.ties_embeddings and m.shape_known and s.quant == "q8_0"
    # the weights the predictor holds are the bytes the file's tensors take
    weights = memory.weight_bytes(s, engines.for_scenario(s))
    assert weights == pytest.approx(_tensor_bytes(path), rel=1e-6)
    assert s.embed_bits == 16.0 and s.head_bits == 8.5
    # K/V by the file's 2 KV heads of 32: 2 x 3 layers x 64 elements a token
    assert m.kv_elements_per_token() == 2 * 3 * 2 * 32
    assert any("read from my-own-model.gguf" in n for n in s.notes)
    # rows naming the same unchanged file share one read
    from tightfit.predictor import scenario
    hits = scenario._read_model_file.cache_info().hits
    parse_row(_row(str(path)))
    assert scenario._read_model_file.cache_info().hits == hits + 1
    # an unknown name alone could not be predicted
    with pytest.raises(RowError):
        parse_row({**_row(str(path)), "model": {"name": "my-own-model"}})


def test_a_written_mixture_of_experts_reads_its_active_share(tmp_path: Path) -> None:
    path = _write(tmp_path / "moe.gguf", experts=8, used=2, ffn=256)
    m = parse_row(_row(str(path))).model
    experts = 3 * 8 * 3 * 256 * 256
    assert m.expert_params_b == pytest.approx(experts / 1e9)
    assert m.params_b - m.active_params_b == pytest.approx(experts * 6 / 8 / 1e9)
    assert m.is_moe and m.intermediate_size == 256


def test_the_packaged_gemma_3_270m_file_matches_its_name_and_its_bytes() -> None:
    """The real file: the table knows its family (window layers from it); its weights are the
    file's tensor data (the file less its header, 6.5 MB: the 262,144-token vocabulary with its
    scores and types, and the tensor table); predictions agree with the name-based row within
    1%. (The written files above are checked byte for byte against gguf's own reader, which
    takes ~11 s over this vocabulary.)"""
    from tightfit.engine.loader.resolve import resolve_model

    path = str(resolve_model("gemma3"))
    s = parse_row(_row(path))
    assert s.quant == "q4_k_m" and s.model.ties_embeddings
    assert s.model.window_layers == 15 and s.model.sliding_window == 512
    weights = memory.weight_bytes(s, engines.for_scenario(s))
    size = Path(path).stat().st_size
    assert size - 7e6 < weights < size - 6e6
    by_file, by_name = predict([_row(path), {**_row(path), "model": "gemma-3-270m",
                                             "quant": "Q4_K_M"}])
    assert by_file["decode_tok_s"] == pytest.approx(by_name["decode_tok_s"], rel=0.01)
    assert by_file["peak_memory_gb"] == pytest.approx(by_name["peak_memory_gb"], rel=0.01)
    # its trained context (gemma3.context_length): a longer one is said, and caps the headroom
    assert s.model.trained_context == 32768
    assert by_file["capacity"]["max_context_tokens"] == 32768  # a 4090 holds far more
    longer = predict([{**_row(path), "workload": {"prompt_tokens": 64, "gen_tokens": 32,
                                                  "context_tokens": 65536}}])[0]
    assert any(n.startswith("workload.context_tokens 65536 is past the 32768 positions")
               for n in longer["notes"])
    assert not any("positions the model was trained" in n for n in by_file["notes"])


def test_bad_files_and_mismatched_formats_are_row_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    text = tmp_path / "notes.gguf"
    text.write_text("not a gguf file")
    cases = {
        str(tmp_path / "missing.gguf"): ("model.path", "no file"),
        str(empty): ("model.path", "not a readable GGUF"),
        str(text): ("model.path", "not a GGUF file"),
        str(tmp_path / "x.safetensors"): ("model.path", "neither a .gguf file nor a model"),
    }
    for p, (field, words) in cases.items():
        out = predict([_row(p)])[0]
        assert out["error"]["field"] == field and words in out["error"]["message"], out
    out = predict([_row(str(path), quant="Q4_K_M")])[0]
    assert out["error"]["field"] == "quant" and "Q8_0" in out["error"]["message"]
    assert "error" not in predict([_row(str(path), quant="Q8_0")])[0]
    # a service that must not open files a request names
    out = predict([_row(str(path))], files=False)[0]
    assert out["error"]["field"] == "model.path"


def _start(path: Path, arch: str, layers: int, kv_heads: list[int]):
    """A writer for a 64-wide, 4-head model of `layers` layers with these K/V heads a layer."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(kv_heads)
    return w


def _finish(w) -> None:
    """An F16 file with a 300 x 64 token embedding and one layer's Q: the header is the test."""
    w.add_file_type(1)
    w.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gemma_4_layout_reads_its_window_layers_and_full_layers_apart(tmp_path: Path) -> None:
    """Gemma 4's header: a per-layer window pattern, K/V heads per layer, and the window layers'
    head size apart from the full layers' (attention.key_length_swa). The window layers' K/V
    sets the per-token size; the full layers hold theirs (1 head of 32 against 4 of 16: half)."""
    p = tmp_path / "my-gemma4-like.gguf"
    w = _start(p, "gemma4", 6, [4, 4, 4, 4, 4, 1])
    w.add_key_length(32)
    w.add_uint32("gemma4.attention.key_length_swa", 16)
    w.add_sliding_window(512)
    w.add_array("gemma4.attention.sliding_window_pattern", [True] * 5 + [False])
    _finish(w)
    s = parse_row(_row(str(p)))
    m = s.model
    assert (m.n_kv_heads, m.head_dim, m.sliding_window, m.window_layers) == (4, 16, 512, 5)
    assert m.full_kv_scale == 0.5 and s.quant == "fp16"


def test_an_unknown_hybrid_reads_its_attending_layers_and_recurrent_state(tmp_path: Path) -> None:
    """A Gated DeltaNet hybrid the table does not know (llama.cpp architecture qwen35): K/V
    heads per layer say which layers attend (1 in 4), the ssm.* keys give a recurrent layer's
    state (32 value heads of 128 over 16 key heads of 128, a 4-wide convolution)."""
    from tightfit.predictor import architectures

    p = tmp_path / "some-new-hybrid.gguf"
    w = _start(p, "qwen35", 4, [0, 0, 0, 2])
    for k, v in (("ssm.state_size", 128), ("ssm.inner_size", 4096), ("ssm.group_count", 16),
                 ("ssm.time_step_rank", 32), ("ssm.conv_kernel", 4)):
        w.add_uint32(f"qwen35.{k}", v)
    _finish(w)
    m = parse_row(_row(str(p))).model
    assert (m.mixer, m.kv_layers, m.n_kv_heads) == ("gated_deltanet", 1, 2)
    assert m.state_bytes_per_layer == architectures.gated_deltanet_state(32, 16, 128, 128, 4)
