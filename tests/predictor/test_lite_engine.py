"""The lite runtime as an engine of the predictor: accepted on CPUs with the block formats it
reads (a clear row error otherwise), its memory from the file's own blocks and half-float K/V,
checked against the real loaded model; in the fit with an engine feature of its own."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tightfit.predictor import memory, predict
from tightfit.predictor.datasets import load_own
from tightfit.predictor.engines import profile
from tightfit.predictor.scenario import parse_row

CPU = {"name": "local-2core", "kind": "cpu", "memory_gb": 24, "memory_bandwidth_gbps": 20,
       "cpu_cores": 2}
DATASET = Path(__file__).resolve().parents[2] / "data" / "measurements" / "cpu-2core.jsonl"


def _lite_row(row: dict[str, Any]) -> dict[str, Any]:
    row.update(engine="lite", quant="Q4_1", hardware=dict(CPU),
               model={"name": "SmolLM2-135M-Instruct"})
    return row


def test_lite_rows_are_answered_on_a_cpu(row: dict[str, Any]) -> None:
    out = predict([_lite_row(row)])[0]
    assert "error" not in out, out
    assert out["decode_tok_s"] > 0 and out["peak_memory_gb"] > 0


@pytest.mark.parametrize("change, field", [
    ({"hardware": "RTX 3070"}, "engine"), ({"quant": "Q4_K_M"}, "quant")])
def test_what_the_lite_runtime_cannot_run_is_a_row_error(row: dict[str, Any], change: dict,
                                                          field: str) -> None:
    bad = {**_lite_row(row), **change}
    out = predict([bad, _lite_row(dict(row))])
    assert field in json.dumps(out[0]["error"]) and "lite" in json.dumps(out[0]["error"])
    assert "error" not in out[1]


def test_memory_is_the_file_blocks_and_half_kv(row: dict[str, Any]) -> None:
    """Weights as the lite runtime holds them (the GGUF's tensors, read in place) against the
    real file; K/V at 2 bytes a value, against the runtime's own figure."""
    from tightfit.lite import LiteModel

    lite = LiteModel(None, max_num_seqs=1, max_model_len=64)
    s = parse_row(_lite_row(row))
    stored = sum(t.data.nbytes for t in lite.gguf.tensors())
    assert memory.held_weight_bytes(s, profile(s.engine, "cpu")) == pytest.approx(stored,
                                                                                   rel=0.05)
    assert memory.kv_bytes_per_token(s, profile(s.engine, "cpu")) == lite.kv_bytes_per_token()


def test_lite_runs_are_fitted_with_an_engine_feature_of_their_own() -> None:
    """The lite rows join the fit (own dataset, several stored formats) marked by engine_lite,
    which no other engine's rows carry, so they cannot pull llama.cpp's residual."""
    from tightfit.predictor.features import features
    from tightfit.predictor.roofline import analyse

    obs, _ = load_own([DATASET])
    lite = [o for o in obs if o.scenario.engine == "tightfit-lite"]
    assert {o.metric for o in lite} >= {"decode_tok_s", "prefill_tok_s", "ttft_s",
                                        "peak_memory_gb"}
    assert {o.scenario.quant for o in lite} >= {"q4_1", "q8_0", "f16"}
    for o in obs:
        f = features(o.scenario, analyse(o.scenario), "decode")
        assert f["engine_lite"] == (1.0 if o.scenario.engine == "tightfit-lite" else 0.0)
    r = subprocess.run([sys.executable, "-m", "tightfit", "predictor", "score", str(DATASET),
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["per_engine"]["score"]
    assert got["tightfit-lite"]["decode_tok_s"]["n"] == sum(
        o.metric == "decode_tok_s" for o in lite)
