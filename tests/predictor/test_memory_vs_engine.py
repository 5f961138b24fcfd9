"""The predictor's weight memory for tightfit checked against the engine itself: the real
default model loaded in each weight format, its tensors counted byte by byte."""
from __future__ import annotations

import pytest
import torch

from tightfit.predictor import memory
from tightfit.predictor.engines import profile
from tightfit.predictor.scenario import parse_row


def _held_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights the model keeps (rotary tables excluded: they are sized by the context,
    not the weights), fbgemm-packed int8 weights included."""
    from tightfit.engine.quant.linear import held_bytes

    return held_bytes(model, skip_suffixes=("cos", "sin_signed"))


@pytest.mark.parametrize("engine_quant,predictor_quant", [
    ("fp32", "fp32"), ("native", "Q4_1"), ("int8", "int8"), ("int4-g64", "int4-g64")])
def test_held_weights_match_the_loaded_default_model(row, engine_quant, predictor_quant):
    from tightfit.engine.loader.model_loader import load_model

    loaded = load_model("default", engine_quant)
    measured = _held_bytes(loaded.model)
    row.update(engine="tightfit", quant=predictor_quant,
               hardware={"name": "local-2core", "kind": "cpu", "memory_gb": 24,
                         "memory_bandwidth_gbps": 20, "cpu_cores": 2},
               model={"name": "SmolLM2-135M-Instruct"})
    s = parse_row(row)
    assert s.model.ties_embeddings
    predicted = memory.held_weight_bytes(s, profile("tightfit", "cpu"))
    assert predicted == pytest.approx(measured, rel=0.05), (predicted / 2**20, measured / 2**20)
