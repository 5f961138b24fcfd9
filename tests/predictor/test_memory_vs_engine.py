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


@pytest.mark.parametrize("model,kv", [("default", "fp32"), ("gemma3", "fp32"), ("default", "int8")])
def test_the_settings_note_matches_the_engines_own_kv_pool(row, model, kv):
    """A tightfit row its defaults refuse names --max-model-len and --kv-cache-memory; the
    defaults' pool in tokens is what the engine sizes (runner.num_kv_blocks on the model's own
    config), and the pool named holds the row's sequences at its context."""
    import re

    from tightfit.config import CacheConfig, SchedulerConfig
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.model_config import config_from_gguf
    from tightfit.engine.loader.resolve import resolve_model
    from tightfit.engine.runner import num_kv_blocks
    from tightfit.predictor import predict

    cfg = config_from_gguf(GGUFFile(resolve_model(model)))
    row.update(engine="tightfit", quant="Q4_1" if model == "default" else "Q4_K_M",
               hardware={"name": "local-2core", "kind": "cpu", "memory_gb": 24,
                         "memory_bandwidth_gbps": 20, "cpu_cores": 2},
               model={"name": "SmolLM2-135M-Instruct" if model == "default" else "gemma-3-270m"})
    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 128, "context_tokens": 8192,
                       "batch": 3, "kv_dtype": kv}
    (note,) = [n for n in predict([row])[0]["notes"] if n.startswith("tightfit's engine runs")]
    mib, held = re.search(r"--kv-cache-memory (\d+)MiB.*\((\d+) tokens", note).groups()
    assert "--max-model-len 8192" in note
    assert int(held) == num_kv_blocks(cfg, CacheConfig(kv_dtype=kv)) * 16
    pool = num_kv_blocks(cfg, CacheConfig(kv_dtype=kv, kv_cache_bytes=int(mib) * 2**20))
    assert 3 * 8192 <= pool * 16 < 3 * 8192 * 1.01
    row["workload"] = {"prompt_tokens": 512, "gen_tokens": 128, "context_tokens": 1024}
    assert not any("tightfit's engine runs" in n for n in predict([row])[0]["notes"])
    assert SchedulerConfig().max_model_len == 2048
