"""Precision plans on the real default model: per-projection/per-layer formats give the expected
modules and a model that generates; bad plans and format names fail naming the value."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tightfit.errors import TightfitError

PLAN = """\
default: int4-g64
rules:
  gate_proj: fp32          # every layer: gate runs beside int4 up (SplitLinear)
  "layers.0.*": int8       # the whole first layer (later rules win)
  v_proj: native           # stored Q4_1 blocks, exact int4 group 32
  lm_head: int8
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from tightfit import LLM

    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    path.write_text(PLAN)
    return LLM(quant=str(path), num_threads=2)


def test_plan_gives_the_expected_modules(planned) -> None:
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear
    from tightfit.engine.quant.plan import SplitLinear

    model = planned.loaded.model
    first, later = model.layers[0], model.layers[5]
    # Layer 0: int8 everywhere except v (native, a later rule) -> q, k int8 beside v int4.
    assert isinstance(first.mlp.gate_up, Int8Linear) and isinstance(first.attn.o, Int8Linear)
    q, k, v = first.attn.qkv.parts
    assert isinstance(q, Int8Linear) and isinstance(k, Int8Linear)
    assert isinstance(v, Int4Linear) and v.group_size == 32
    # Later layers: q/k int4-g64 beside native v; gate fp32 beside int4 up; o, down int4-g64.
    q, k, v = later.attn.qkv.parts
    assert (q.group_size, k.group_size, v.group_size) == (64, 64, 32)
    gate, up = later.mlp.gate_up.parts
    assert isinstance(later.mlp.gate_up, SplitLinear) and isinstance(gate, torch.nn.Linear)
    assert isinstance(up, Int4Linear) and up.group_size == 64
    assert isinstance(later.mlp.down, Int4Linear) and isinstance(model.lm_head, Int8Linear)


def test_planned_model_generates(planned) -> None:
    from tightfit import SamplingParams

    out = planned.generate(["The capital of France is"], SamplingParams(max_tokens=4))[0]
    assert "Paris" in out.text


@pytest.mark.parametrize("plan, needle", [
    ("default: int4-g64\nrules:\n  layers.99.q_proj: int8\n", "layers.99.q_proj"),
    ("default: int4-g64\nrules:\n  qproj: int8\n", "qproj"),
    ("default: int4-g48\n", "int4-g48"),
    ("default: int3\n", "int3"),
    ("rules:\n  q_proj: int8\n", "default"),
])
def test_bad_plans_name_the_value(tmp_path: Path, plan: str, needle: str) -> None:
    from tightfit import LLM

    path = tmp_path / "plan.yaml"
    path.write_text(plan)
    with pytest.raises(TightfitError, match=needle) as err:
        LLM(quant=str(path), num_threads=2)
    if "99" in needle:
        assert "30-layer" in str(err.value)


@pytest.mark.parametrize("name", ["int5", "int4-g100", "fp16", "int4-awq"])
def test_unknown_format_names_the_value(name: str) -> None:
    from tightfit import LLM

    with pytest.raises(TightfitError, match=name):
        LLM(quant=name, num_threads=2)


def test_group_that_does_not_divide_pads_or_fails_naming_the_dimension() -> None:
    """Hidden 576 is not a multiple of 128: int4-g128 pads it to 640 (the stated fallback);
    without padding it is an error naming the dimension."""
    from tightfit.engine.quant.linear import quantize_linear

    w = torch.randn(64, 576)
    assert quantize_linear(w, None, "int4-g128").in_padded == 640
    with pytest.raises(TightfitError, match="576"):
        quantize_linear(w, None, "int4-g128", pad=False)
