"""Load-time memory: rotary tables sized to the context in use, and load temporaries that leave
the resident set (real default model, in a fresh process so the high-water mark is its own)."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from tightfit.engine.models.layers import INITIAL_ROPE_ROWS, Rotary

_LOAD = """
import json, psutil, torch
from tightfit import sysmem
from tightfit.engine.loader.model_loader import load_model
before = psutil.Process().memory_info().rss
loaded = load_model("default", "int8")
print(json.dumps({"before": before / 2**20, "after": psutil.Process().memory_info().rss / 2**20,
                  "peak": sysmem.peak_rss_mib()}))
"""


def test_rotary_tables_grow_on_demand_and_match_a_full_table():
    full_rows = INITIAL_ROPE_ROWS * 4
    lazy = Rotary(64, 10000.0, full_rows)
    assert lazy.cos.shape[0] == INITIAL_ROPE_ROWS
    positions = torch.tensor([3, INITIAL_ROPE_ROWS + 5, full_rows - 1])
    x = torch.randn(3, 2, 64)
    out = lazy(x, positions)  # eager call past the table: grows, never indexes out of range
    assert lazy.cos.shape[0] == full_rows
    reference = Rotary(64, 10000.0, full_rows)
    reference.ensure(full_rows)
    torch.testing.assert_close(out, reference(x, positions), rtol=0, atol=0)
    small = Rotary(64, 10000.0, 100)  # a short model never builds more than its maximum
    small.ensure(10_000)
    assert small.cos.shape[0] == 100


def test_engine_sizes_rotary_tables_to_max_model_len():
    from tightfit.engine.llm import LLM

    llm = LLM("default", quant="native", max_model_len=INITIAL_ROPE_ROWS + 1)
    rows = [r.cos.shape[0] for r in llm.loaded.model.rotaries]
    assert all(INITIAL_ROPE_ROWS < n <= llm.loaded.config.max_position for n in rows), rows


def test_load_temporaries_leave_the_resident_set():
    """int8 of the default model re-quantises every stored weight chunk by chunk; before the
    load-time heap policy the freed chunks stayed resident (peak 590-700 MiB vs 420 after load)."""
    out = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True,
                         timeout=300, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    held = m["after"] - m["before"]
    assert 120 < held < 260, m  # int8 body + Q8_0 embedding + int8 head, ~160 MiB of tensors
    assert m["peak"] - m["after"] < 120, m


def _tensor_bytes(model: torch.nn.Module) -> int:
    from tightfit.engine.quant.linear import held_bytes

    return held_bytes(model, skip_suffixes=("cos", "sin_signed"))


def test_weight_bytes_predicted_from_the_header_bound_what_loading_holds():
    """The pre-load budget check relies on 90% of the prediction being a lower bound."""
    from tightfit.engine.llm import predicted_weight_bytes
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.model_loader import load_model
    from tightfit.engine.loader.resolve import resolve_model

    g = GGUFFile(resolve_model("default"))
    for quant in ("fp32", "native", "int8", "int4-g64"):
        held = _tensor_bytes(load_model("default", quant).model)
        predicted = predicted_weight_bytes(g, quant)
        assert predicted is not None and 0.9 * predicted <= held <= 1.1 * predicted, (
            quant, held / 2**20, predicted / 2**20)
    assert predicted_weight_bytes(g, "plan.yaml") is None


def test_a_hopeless_budget_is_refused_before_loading(monkeypatch):
    import pytest

    import tightfit.engine.llm as llm_mod
    from tightfit.errors import TightfitError

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llm_mod, "load_model", no_load)
    with pytest.raises(TightfitError, match="predicted before loading.*--memory-budget"):
        llm_mod.LLM("default", quant="native", memory_budget="200MiB")
