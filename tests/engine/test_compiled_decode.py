"""Compiled decode (`LLM(compile_decode=True)`, engine/compiled.py) against the eager engine on
tiny models (a Llama-style GQA model with int4 projections, and a Gemma-3-style one with sliding
windows, QK-norm and a soft-capped head): same greedy tokens, same logits within float rounding,
with one and several sequences of different lengths decoding together, and steps that are not
plain decodes left to the eager path. Tiny models keep Inductor's compile short (two variants of
two layers); the real model takes minutes to compile cold, so it is measured by the benchmark.
"""
from __future__ import annotations

import pytest
import torch

from tightfit.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from tightfit.engine.engine import LLMEngine
from tightfit.engine.models.transformer import DecoderModel
from tightfit.engine.quant.plan import PlanLinearFactory, PrecisionPlan
from tightfit.engine.sampling_params import SamplingParams


class _Decoder:
    def push(self, token_id: int) -> str:
        return chr(65 + token_id % 26)

    def flush(self) -> str:
        return ""


class _Tok:
    stop_token_ids = frozenset()

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def incremental_decoder(self, skip_special_tokens: bool = True) -> _Decoder:
        return _Decoder()


def _config(kind: str) -> ModelConfig:
    base = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, head_dim=16,
                intermediate_size=128, max_position=512)
    if kind == "gemma3":
        return ModelConfig(architecture="gemma3", num_kv_heads=1, hidden_act="gelu_tanh",
                           rope_local_theta=10000.0, sliding_window=24, sliding_window_pattern=2,
                           qk_norm=True, sandwich_norm=True, embed_scale=8.0,
                           query_pre_attn_scalar=16.0, rms_eps=1e-6, final_logit_softcap=30.0,
                           **base)
    return ModelConfig(architecture="llama", num_kv_heads=2, **base)


def _weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h, kv, q, inter = (cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim,
                       cfg.num_heads * cfg.head_dim, cfg.intermediate_size)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    w = {"embed_tokens.weight": rand(cfg.vocab_size, h, scale=1.0), "norm.weight": 1 + rand(h)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + rand(h),
              p + "post_attention_layernorm.weight": 1 + rand(h),
              p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
              p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
              p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
              p + "mlp.down_proj.weight": rand(h, inter)}
        if cfg.sandwich_norm:
            w |= {p + "pre_feedforward_layernorm.weight": 1 + rand(h),
                  p + "post_feedforward_layernorm.weight": 1 + rand(h)}
        if cfg.qk_norm:
            w |= {p + "self_attn.q_norm.weight": 1 + rand(cfg.head_dim),
                  p + "self_attn.k_norm.weight": 1 + rand(cfg.head_dim)}
    return w


def _engine(model: DecoderModel, cfg: ModelConfig, compiled: bool) -> LLMEngine:
    return LLMEngine(model, _Tok(), EngineConfig(
        model=cfg, cache=CacheConfig(block_size=8, kv_cache_bytes=4 << 20),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256),
        compile_decode=compiled))


def _run(engine: LLMEngine, prompts: list[list[int]], n: int) -> dict[str, list[int]]:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, sp) for p in prompts]
    done: dict[str, list[int]] = {}
    while len(done) < len(ids):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return {rid: done[rid] for rid in ids}


@pytest.mark.parametrize("kind", ["llama-int4", "gemma3"])
def test_compiled_decode_matches_eager(kind: str) -> None:
    torch.manual_seed(0)
    cfg = _config("gemma3" if kind == "gemma3" else "llama")
    factory = (PlanLinearFactory(PrecisionPlan.parse("int4-g32")) if kind == "llama-int4"
               else None)
    model = (DecoderModel(cfg, _weights(cfg), factory) if factory
             else DecoderModel(cfg, _weights(cfg)))
    # one sequence, then three of different lengths in one length bucket (a padded mask; the
    # contexts grow past the Gemma-style window of 24)
    jobs = [([[5, 9, 14, 3]], 12), ([list(range(20, 40)), list(range(40, 68)),
                                    list(range(70, 100))], 20)]
    eager = _engine(model, cfg, compiled=False)
    compiled = _engine(model, cfg, compiled=True)
    assert compiled.runner.compiled is not None and eager.runner.compiled is None
    for prompts, n in jobs:
        want = list(_run(eager, prompts, n).values())
        got = list(_run(compiled, prompts, n).values())
        assert got == want
    # decode-only steps took the compiled path (11 + at least 17), prefills did not
    assert 11 + 17 <= compiled.runner.compiled_steps < compiled.num_steps


def test_int8_kv_and_reference_attention_stay_eager() -> None:
    cfg = _config("llama")
    model = DecoderModel(cfg, _weights(cfg))
    engine = LLMEngine(model, _Tok(), EngineConfig(
        model=cfg, cache=CacheConfig(block_size=8, kv_cache_bytes=4 << 20, kv_dtype="int8"),
        compile_decode=True))
    assert engine.runner.compiled is None  # no compile, no warm-up cost
    ref = LLMEngine(model, _Tok(), EngineConfig(model=cfg, attention="reference",
                                                compile_decode=True))
    assert ref.runner.compiled is None
