"""The TorchScript decode stack (engine/scripted.py, on by default) against the eager modules on
the real models: every decode step it runs is also run eagerly on the same inputs.

The plain stack (ATen ops only) must give bit-identical logits (same kernels, same op order),
across weight formats (fp32, GGUF native int4, int8 head, int4 with padded input, a plan with
side-by-side projections), one and several sequences, padded masks, several length buckets, and
Gemma 3's sliding-window layers past the window. The fused stack (engine/kernels/decode.cpp, the
default where the kernels build) must agree to float rounding on the fp32 models, and on the
4-bit model to the noise its bf16 activations already carry. Steps it must not take (prefill,
int8 KV, reference attention) stay eager.
"""
from __future__ import annotations

import json

import pytest
import torch

from tightfit import LLM, SamplingParams
from tightfit.engine import kernels
from tightfit.engine.scripted import ScriptedDecode

needs_kernels = pytest.mark.skipif(not kernels.load(), reason=f"kernels: {kernels.why_not()}")


def _decode_both_ways(llm: LLM, prompts: list[str], max_tokens: int = 6, fused: bool = False
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Generates greedily; each step the scripted path (the plain stack, or the fused one) takes
    is first run eagerly on the same inputs (writing the same K/V). Returns, per scripted step,
    the (eager, scripted) logits."""
    runner = llm.engine.runner
    scripted = ScriptedDecode(llm.loaded.model, fused=fused)  # built now, not from the cache
    saved, execute = runner.scripted, runner.execute
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def both(out):  # type: ignore[no-untyped-def]
        runner.scripted = None
        _, eager = execute(out)
        runner.scripted = scripted
        before = runner.scripted_steps
        seqs, logits = execute(out)
        if runner.scripted_steps > before:
            pairs.append((eager, logits))
        return seqs, logits

    runner.execute = both
    try:
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                             ignore_eos=True))
    finally:
        runner.execute, runner.scripted = execute, saved
    return pairs


def _bit_equal(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    return [torch.equal(a, b) for a, b in pairs]


def _max_diff(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(float((a - b).abs().max()) for a, b in pairs)


PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived",
           "def fibonacci(n):"]


def test_fp32_single_and_batched_with_padding_masks(default_llm):
    equal = _bit_equal(_decode_both_ways(default_llm, PROMPTS[:1]))
    equal += _bit_equal(_decode_both_ways(default_llm, PROMPTS))  # different lengths: padding
    assert len(equal) >= 10 and all(equal)


@needs_kernels
def test_fused_fp32_single_and_batched(default_llm):
    pairs = _decode_both_ways(default_llm, PROMPTS[:1], fused=True)
    pairs += _decode_both_ways(default_llm, PROMPTS, fused=True)
    assert len(pairs) >= 10
    assert _max_diff(pairs) < 1e-3  # logits of magnitude ~30; measured ~3e-5
    assert all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in pairs)


@pytest.mark.parametrize("quant", ["native", "int4-g128", "int8"])
def test_quantised_formats(quant):
    # native: GGUF Q4_1 on int4-g32 kernels, int8 head; int4-g128: 576 inputs padded to 640;
    # int8: fbgemm's int8x2 path (fused: its activation split and join as kernels)
    llm = LLM(quant=quant, num_threads=2)
    assert all(_bit_equal(_decode_both_ways(llm, PROMPTS)))
    if kernels.load():
        # bf16 activations: a relative 1e-6 change of the input moves these logits by 0.1-0.4
        # (measured), so the fused kernels' float rounding may too; the ranking must hold
        pairs = _decode_both_ways(llm, PROMPTS, max_tokens=8, fused=True)
        assert len(pairs) >= 5 and _max_diff(pairs) < 1.5
        agree = torch.cat([a.argmax(-1) == b.argmax(-1) for a, b in pairs]).float().mean()
        assert agree >= 0.9


def test_side_by_side_projections_and_several_length_buckets(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": "int4-g64",
                                "rules": {"k_proj": "int8", "up_proj": "fp32", "lm_head": "int8"}}))
    llm = LLM(quant=str(plan), num_threads=2)
    long_prompt = " ".join(["word"] * 120)  # far longer than the others: its own length bucket
    equal = _bit_equal(_decode_both_ways(llm, [PROMPTS[0], long_prompt, PROMPTS[2]]))
    assert len(equal) >= 5 and all(equal)
    # side-by-side projections (different formats in one fused matmul) stay on the plain stack
    assert ScriptedDecode.for_model(llm.loaded.model).fused is False


@needs_kernels
def test_fused_several_length_buckets(default_llm):
    long_prompt = " ".join(["word"] * 300)  # its own bucket, and attention split into chunks
    pairs = _decode_both_ways(default_llm, [PROMPTS[0], long_prompt, PROMPTS[2]], fused=True)
    assert len(pairs) >= 5 and _max_diff(pairs) < 1e-3


def test_gemma_sliding_window_past_the_window(gemma_llm):
    window = gemma_llm.loaded.config.sliding_window
    long_prompt = " ".join(["river"] * (window + 40))
    ids = gemma_llm.tokenizer.encode(long_prompt)
    assert len(ids) > window  # decode steps attend past the window: sliding masks in use
    equal = _bit_equal(_decode_both_ways(gemma_llm, [long_prompt, PROMPTS[0]], max_tokens=4))
    assert len(equal) >= 3 and all(equal)
    if kernels.load():  # QK-norm, sandwich norms, GELU, local rotary, the window in the kernel
        pairs = _decode_both_ways(gemma_llm, [long_prompt, PROMPTS[0]], max_tokens=4,
                                  fused=True)
        assert len(pairs) >= 3 and _max_diff(pairs) < 1e-3


def test_greedy_tokens_match_the_eager_engine(default_llm):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    scripted = [o.token_ids for o in default_llm.generate(PROMPTS, params)]
    runner = default_llm.engine.runner
    saved, runner.scripted = runner.scripted, None
    try:
        plain = [o.token_ids for o in default_llm.generate(PROMPTS, params)]
    finally:
        runner.scripted = saved
    assert scripted == plain


def test_steps_it_does_not_reproduce_stay_eager(default_llm):
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    int8_kv = default_llm.derive(kv_dtype="int8")
    assert int8_kv.engine.runner.scripted is None
    reference = default_llm.derive(attention="reference")
    assert reference.engine.runner.scripted is None
    runner = default_llm.engine.runner
    before = runner.scripted_steps
    default_llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1, temperature=0.0))
    assert runner.scripted_steps == before  # one token = prefill only
    default_llm.generate([PROMPTS[0]], params)
    assert runner.scripted_steps == before + 3


def test_a_module_it_does_not_know_keeps_the_model_eager(default_llm):
    model = default_llm.loaded.model

    class Odd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    layer = model.layers[0].mlp
    saved = layer.down
    try:
        layer.down = Odd()
        probe = object.__new__(type(model))  # fresh attribute space: no cached stack
        probe.__dict__.update(model.__dict__)
        probe.__dict__.pop("_tightfit_scripted_decode", None)
        assert ScriptedDecode.for_model(probe) is None
    finally:
        layer.down = saved
