"""The TorchScript decode stack (engine/scripted.py, on by default) against the eager modules on
the real models: every decode step it runs is also run eagerly, and the logits must be
bit-identical (same kernels, same op order), across weight formats (fp32, GGUF native int4, int8
head, int4 with padded input, a plan with side-by-side projections), one and several sequences,
padded masks, several length buckets, and Gemma 3's sliding-window layers past the window.
Steps it must not take (prefill, int8 KV, reference attention) stay eager.
"""
from __future__ import annotations

import json

import pytest
import torch

from tightfit import LLM, SamplingParams
from tightfit.engine.scripted import ScriptedDecode


def _decode_both_ways(llm: LLM, prompts: list[str], max_tokens: int = 6) -> list[bool]:
    """Generates greedily; each step the scripted path takes is first run eagerly on the same
    inputs (writing the same K/V). Returns, per scripted step, whether the logits were equal."""
    runner = llm.engine.runner
    scripted = runner.scripted
    assert scripted is not None
    execute = runner.execute
    equal: list[bool] = []

    def both(out):  # type: ignore[no-untyped-def]
        runner.scripted = None
        _, eager = execute(out)
        runner.scripted = scripted
        before = runner.scripted_steps
        seqs, logits = execute(out)
        if runner.scripted_steps > before:
            equal.append(torch.equal(eager, logits))
        return seqs, logits

    runner.execute = both
    try:
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                             ignore_eos=True))
    finally:
        runner.execute = execute
    return equal


PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived",
           "def fibonacci(n):"]


def test_fp32_single_and_batched_with_padding_masks(default_llm):
    equal = _decode_both_ways(default_llm, PROMPTS[:1])
    equal += _decode_both_ways(default_llm, PROMPTS)  # different lengths: padded masks
    assert len(equal) >= 10 and all(equal)


@pytest.mark.parametrize("quant", ["native", "int4-g128"])
def test_quantised_formats(quant):
    # native: GGUF Q4_1 on int4-g32 kernels, int8 head; int4-g128: 576 inputs padded to 640
    llm = LLM(quant=quant, num_threads=2)
    assert all(_decode_both_ways(llm, PROMPTS))
    assert llm.engine.runner.scripted_steps > 0


def test_side_by_side_projections_and_several_length_buckets(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": "int4-g64",
                                "rules": {"k_proj": "int8", "up_proj": "fp32", "lm_head": "int8"}}))
    llm = LLM(quant=str(plan), num_threads=2)
    long_prompt = " ".join(["word"] * 120)  # far longer than the others: its own length bucket
    equal = _decode_both_ways(llm, [PROMPTS[0], long_prompt, PROMPTS[2]])
    assert len(equal) >= 5 and all(equal)


def test_gemma_sliding_window_past_the_window(gemma_llm):
    window = gemma_llm.loaded.config.sliding_window
    long_prompt = " ".join(["river"] * (window + 40))
    ids = gemma_llm.tokenizer.encode(long_prompt)
    assert len(ids) > window  # decode steps attend past the window: sliding masks in use
    equal = _decode_both_ways(gemma_llm, [long_prompt, PROMPTS[0]], max_tokens=4)
    assert len(equal) >= 3 and all(equal)


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
