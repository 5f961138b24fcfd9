"""Evaluation machinery: exact scores, grouped folds, and a held-out gain over the baselines."""
from __future__ import annotations

import pytest

from tightfit.predictor import datasets, evaluate
from tightfit.predictor.hardware import COPY_OF_PEAK


def test_scores_exact() -> None:
    s = evaluate.scores([110.0, 90.0, 100.0, 150.0], [100.0, 100.0, 100.0, 100.0])
    assert (s.n, s.mape, s.median, s.max) == (4, 17.5, 10.0, 50.0)
    assert s.p90 == 50.0


def test_folds_are_grouped_and_seeded() -> None:
    groups = [f"m{i}" for i in range(25)]
    a, b = evaluate.fold_of(groups, 10), evaluate.fold_of(groups, 10)
    assert a == b and set(a.values()) == set(range(10))
    assert evaluate.fold_of(groups, None) == {g: i for i, g in enumerate(sorted(groups))}


def test_data_rules_are_applied_and_counted() -> None:
    obs, rules = datasets.load_all()
    assert rules["provider ollama (not llama.cpp)"] == 73
    assert any(k.startswith("relabelled to host CPU") for k in rules)
    assert {o.source for o in obs} == {"apple", "llmfit", "design", "tightfit"}
    assert all(o.value > 0 for o in obs)


def test_llmfit_rows_take_the_request_as_their_context_and_the_files_tags() -> None:
    """The table does not say the server's context: each row runs with its request's (a
    64-token prompt and the tokens it generated), as the llama.cpp model keeps a given context."""
    obs, _ = datasets.load_llmfit()
    assert obs
    for o in obs:
        w = o.scenario.workload
        assert w.prompt_tokens == 64 and w.context_tokens == 64 + w.gen_tokens
    # the three gemma-2-9b-it-Q4_K_M-fp16.gguf rows keep the file's f16 embedding
    tagged = [o for o in obs if o.scenario.embed_bits is not None]
    assert len(tagged) == 3 and all(o.scenario.embed_bits == 16.0 for o in tagged)


def test_held_out_device_beats_naive_and_analytic_on_apple() -> None:
    obs = datasets.load_apple()
    pairs = evaluate.cross_validate(obs, evaluate.device_key, screen=False)
    held = evaluate.summarise(pairs)
    base = evaluate.summarise(evaluate.analytic_only(obs))
    naive = evaluate.summarise_naive(obs)
    for metric in ("decode_tok_s", "prefill_tok_s"):
        assert held[metric]["mape"] < base[metric]["mape"] < naive[metric]["mape"]
    assert held["decode_tok_s"]["mape"] < 12
    assert held["prefill_tok_s"]["mape"] < 10


def test_an_own_run_is_described_by_its_probe_where_it_has_one() -> None:
    """Schema-4 rows: compute is the GEMM probed around the run on its own threads; older rows
    get their share of the cached all-core rate. Bandwidth is the cached copy rate either way,
    read as its rated equivalent."""
    from types import SimpleNamespace

    hw = dict(threads_used=1, cpu_cores_physical=2, cpu_threads_logical=2, matmul_gflops=200.0,
              memory_bandwidth_gbps=25.0, memory_total_gib=24.0, cpu_model="CPU",
              machine_id="m", probe_bandwidth_gbps=18.0)
    probed = datasets.own_device(SimpleNamespace(**hw, probe_matmul_gflops=140.0))
    cached = datasets.own_device(SimpleNamespace(**hw, probe_matmul_gflops=None))
    assert probed.fp16_tflops == pytest.approx(0.140) and cached.fp16_tflops == pytest.approx(0.1)
    assert probed.copy_bandwidth_gbps == cached.copy_bandwidth_gbps == 25.0
    assert probed.bandwidth_gbps == cached.bandwidth_gbps == pytest.approx(25.0 / COPY_OF_PEAK,
                                                                           abs=0.01)
    assert probed.name == cached.name  # one device key: the held-out split is unchanged
