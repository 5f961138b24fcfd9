"""tightfit's own dataset as predictor observations: which runs become which observations, and
what each filter rule drops (counted, so the evaluation report can say why)."""
from __future__ import annotations

import json

import pytest

from tightfit.predictor import datasets
from tightfit.predictor.hardware import COPY_OF_PEAK


def _write(tmp_path, rows):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _decode_row(make_row, rid, **changes):
    base = {"id": rid, "run_key": rid, "workload.scenario": "decode", "workload.num_requests": 1,
            "workload.prompt_tokens_mean": 512.0, "results.output_tokens_total": 32,
            "results.decode_tok_s": 18.0, "results.prefill_tok_s": 400.0,
            "results.ttft_s_p50": 1.3, "results.peak_rss_mib": 900.0}
    return make_row(**{**base, **changes})


def test_single_stream_runs_become_observations(tmp_path, make_row):
    rows = [_decode_row(make_row, "a"),
            _decode_row(make_row, "b", **{"config.backend": "hf", "model.weight_format": "fp32",
                                          "workload.prompt_tokens_mean": 16.0}),
            _decode_row(make_row, "c", **{"model.weight_format": "native"}),
            make_row(id="d", run_key="d"),  # chat, two requests: not single-stream
            _decode_row(make_row, "e", contended=True),
            _decode_row(make_row, "f", status="failed", error="boom", results=None)]
    obs, dropped = datasets.load_own([_write(tmp_path, rows)])
    by = {(o.scenario.id.split("-", 1)[1], o.metric): o for o in obs}
    a = {m: by[("a", m)].value for m in ("decode_tok_s", "prefill_tok_s", "ttft_s",
                                          "peak_memory_gb")}
    assert a == {"decode_tok_s": 18.0, "prefill_tok_s": 400.0, "ttft_s": 1.3,
                 "peak_memory_gb": pytest.approx(900 / 1024)}
    sa = by[("a", "decode_tok_s")].scenario
    assert (sa.engine, sa.quant, sa.device.kind, sa.device.cpu_cores) == ("tightfit", "f32",
                                                                          "cpu", 2)
    # the fingerprint's copy rate, kept, and read as its rated equivalent; what the row's probe
    # gained from splitting the copy over its 2 threads (30 vs 18 GB/s) beside it
    assert sa.device.copy_bandwidth_gbps == 20.0 and sa.model.n_layers == 30
    assert sa.device.bandwidth_gbps == pytest.approx(20.0 / COPY_OF_PEAK, abs=0.01)
    assert sa.device.threads_bandwidth_gain == pytest.approx(30.0 / 18.0, abs=1e-3)
    assert (sa.workload.prompt_tokens, sa.workload.gen_tokens, sa.workload.batch) == (512, 32, 1)
    assert by[("b", "decode_tok_s")].scenario.engine == "hf-transformers"
    assert ("b", "prefill_tok_s") not in by  # a 16-token prompt's rate is mostly overhead
    assert by[("c", "decode_tok_s")].scenario.quant == "q4_1"  # native = the GGUF's own blocks
    assert dropped == {"more than one request or stream": 1, "failed run": 1,
                       "contended machine (load from other processes)": 1}


def test_own_observations_are_predictable(tmp_path, make_row):
    from tightfit.predictor.evaluate import analytic_only

    obs, _ = datasets.load_own([_write(tmp_path, [_decode_row(make_row, "a")])])
    for _o, p in analytic_only(obs):
        assert p.decode_tok_s > 0 and p.peak_memory_gb > 0


def test_llama_cpp_rows_join_and_are_scored_per_engine(tmp_path, make_row):
    from tightfit.predictor import report
    from tightfit.predictor.evaluate import analytic_only

    rows = [_decode_row(make_row, "t", **{"model.weight_format": "native"}),
            _decode_row(make_row, "l", **{"config.backend": "llamacpp",
                                          "model.weight_format": "native",
                                          "results.decode_tok_s": 90.0})]
    obs, _ = datasets.load_own([_write(tmp_path, rows)])
    assert {o.scenario.engine for o in obs} == {"tightfit", "llama.cpp"}
    per = report._per_engine(analytic_only(obs))
    assert set(per) == {"tightfit", "llama.cpp"}
    assert per["llama.cpp"]["decode_tok_s"]["n"] == 1
    text = report.render({"n_observations": len(obs), "rules": {},
                          "per_engine": {"device": per}})
    assert "tightfit dataset per engine" in text and "llama.cpp" in text


def test_repeats_of_one_configuration_become_their_median(tmp_path, make_row):
    rows = [_decode_row(make_row, "r0", **{"results.decode_tok_s": 18.0}),
            _decode_row(make_row, "r1", **{"results.decode_tok_s": 30.0,
                                           "results.peak_rss_mib": 1000.0}),
            _decode_row(make_row, "r2", **{"results.decode_tok_s": 20.0,
                                           "results.prefill_tok_s": None}),
            _decode_row(make_row, "other", **{"workload.prompt_tokens_mean": 256.0})]
    obs, dropped = datasets.load_own([_write(tmp_path, rows)])
    decode = sorted((o.scenario.workload.prompt_tokens, o.value) for o in obs
                    if o.metric == "decode_tok_s")
    assert decode == [(256, 18.0), (512, 20.0)]  # the odd repeat (30) does not move it
    by = {(o.scenario.workload.prompt_tokens, o.metric): o.value for o in obs}
    assert by[(512, "prefill_tok_s")] == 400.0  # a repeat without the metric is skipped
    assert by[(512, "peak_memory_gb")] == pytest.approx(900 / 1024)
    assert dropped == {"repeat merged into its configuration's median": 2}


def test_a_machine_is_held_out_at_every_thread_count(tmp_path, make_row):
    """Two machines at 1 and 2 threads: four devices, two machines. Held out by machine, a
    machine's rows are predicted by a fit that saw none of its thread counts; only tightfit's
    rows are scored, and only their folds are fitted."""
    from tightfit.predictor import evaluate

    rows = [_decode_row(make_row, f"{m}{t}{p}", **{  # machine b decodes at half a's rate
        "hardware.machine_id": m, "hardware.cpu_model": f"CPU {m}", "hardware.threads_used": t,
        "config.threads": t, "workload.prompt_tokens_mean": float(p),
        "results.decode_tok_s": 18.0 * t if m == "a" else 9.0 * t})
        for m in ("a", "b") for t in (1, 2) for p in (128, 512)]
    obs, _ = datasets.load_own([_write(tmp_path, rows)])
    assert len({o.device_key for o in obs}) == 4
    assert len({evaluate.by_machine(o) for o in obs}) == 2
    shared = datasets.load_apple()
    pairs = evaluate.cross_validate(shared + obs, evaluate.by_machine, screen=False,
                                    scored=lambda o: o.source == "tightfit")
    assert {id(o) for o, _ in pairs} == {id(o) for o in obs}
    # the device split's fold for "a x1" still sees "a x2": its prediction differs
    by_device = dict((id(o), p) for o, p in evaluate.cross_validate(
        shared + obs, evaluate.device_key, screen=False, scored=lambda o: o.source == "tightfit"))
    a1 = [(o, p) for o, p in pairs if o.metric == "decode_tok_s"
          and o.scenario.device.cpu_cores == 1 and o.machine_key == obs[0].machine_key]
    assert a1 and all(p.decode_tok_s != by_device[id(o)].decode_tok_s for o, p in a1)


def test_calibrated_split_scales_the_calibration_engines_block_formats_only(tmp_path, make_row):
    """evaluate.calibrated: a machine's row of calibrate's run (tightfit, default model, Q4_1,
    128-token prompt, most threads) sets measured / predicted; its tightfit rows in block formats
    are scaled by it, fp32 and other engines are not, and the calibration row is not scored."""
    from tightfit.predictor import evaluate

    def r(rid, **ch):
        return _decode_row(make_row, rid, **{"workload.prompt_tokens_mean": 128.0,
                                             "model.weight_format": "native", **ch})
    rows = [r("cal", **{"results.decode_tok_s": 40.0}),  # ~0.5 of the base: inside the clip
            r("long", **{"workload.prompt_tokens_mean": 512.0}),
            r("f32", **{"model.weight_format": "fp32"}), r("hf", **{"config.backend": "hf"})]
    obs, _ = datasets.load_own([_write(tmp_path, rows)])
    pairs = evaluate.analytic_only(obs)
    cal_o, cal_p = next((o, p) for o, p in pairs
                        if o.scenario.id.endswith("cal") and o.metric == "decode_tok_s")
    factor = cal_o.value / cal_p.decode_tok_s
    assert 0.3 < factor < 0.8
    got = {(o.scenario.id.split("-", 1)[1], o.metric): p for o, p in evaluate.calibrated(pairs)}
    before = {(o.scenario.id.split("-", 1)[1], o.metric): p for o, p in pairs}
    assert ("cal", "decode_tok_s") not in got
    k = ("long", "decode_tok_s")
    assert got[k].decode_tok_s == pytest.approx(before[k].decode_tok_s * factor)
    for k in (("f32", "decode_tok_s"), ("hf", "decode_tok_s")):
        assert got[k].decode_tok_s == before[k].decode_tok_s


def _batch_row(make_row, rid, inflight, **changes):
    base = {"id": rid, "run_key": rid, "workload.scenario": "concurrent-16",
            "workload.num_requests": 16, "workload.concurrency": inflight,
            "workload.prompt_tokens_mean": 30.0, "workload.gen_tokens_mean": 64.0,
            "workload.gen_tokens_max": 64, "results.output_tokens_total": 16 * 64,
            "results.decode_tok_s": 40.0 * inflight ** 0.5, "model.weight_format": "native"}
    return make_row(**{**base, **changes})


def test_closed_loop_batches_become_batched_decode_observations(tmp_path, make_row):
    """`batched`: a closed loop of equal generations is one aggregate decode observation at the
    batch the engine ran (the requests in flight, capped by its slots; one in flight is the
    harness's single stream); the fit's single-request rows, open loops, unequal or cut-short
    generations are dropped, each counted."""
    from tightfit.predictor import report
    from tightfit.predictor.evaluate import analytic_only

    rows = [_batch_row(make_row, "c1", 1), _batch_row(make_row, "c4", 4),
            _batch_row(make_row, "c16", 16),
            _batch_row(make_row, "capped", 16, **{"config.max_num_seqs": 8,
                                                  "model.name": "other"}),
            _batch_row(make_row, "open", 8, **{"workload.arrival": "poisson"}),
            _batch_row(make_row, "uneven", 8, **{"workload.gen_tokens_max": 80}),
            _batch_row(make_row, "cut", 8, **{"results.output_tokens_total": 900}),
            _decode_row(make_row, "single")]
    obs, dropped = datasets.load_own([_write(tmp_path, rows)], batched=True)
    by = {o.scenario.id.split("-", 1)[1]: o for o in obs}
    assert set(by) == {"c1", "c4", "c16", "capped"}
    assert {o.metric for o in obs} == {"decode_tok_s", "peak_memory_gb"}
    obs = [o for o in obs if o.metric == "decode_tok_s"]
    by = {o.scenario.id.split("-", 1)[1]: o for o in obs}
    assert [by[k].scenario.workload.batch for k in ("c1", "c4", "c16", "capped")] == [1, 4, 16, 8]
    w = by["c16"].scenario.workload
    assert (w.prompt_tokens, w.gen_tokens, w.context_tokens) == (30, 64, 94)
    assert by["c16"].value == pytest.approx(160.0)
    assert dropped == {"not a closed-loop batch of equal generations": 3,
                       "one stream (scored without --batched)": 1}
    # the batch model: the weights are read once a step for the whole batch, so the aggregate
    # rate does not fall with the batch, and each stream's does
    rate = {o.scenario.workload.batch: p.decode_tok_s for o, p in analytic_only(obs)
            if o.scenario.model.name == "default"}
    assert rate[16] >= rate[4] and rate[16] / 16 < rate[4] / 4
    # without `batched` the same file gives the single stream only
    single, _ = datasets.load_own([_write(tmp_path, rows)])
    assert {o.scenario.workload.batch for o in single} == {1}
    per = report._per_batch(analytic_only(obs))
    assert set(per) == {f"tightfit batch {b}" for b in (1, 4, 8, 16)}
    assert per["tightfit batch 16"]["n"] == 1 and per["tightfit batch 16"]["ratio_median"] > 0
    text = report.render({"n_observations": len(obs), "rules": dict(dropped), "per_batch": per})
    assert "aggregate decode per engine and batch" in text and "tightfit batch 16" in text


def test_a_llama_cpp_servers_slots_share_its_context(tmp_path, make_row):
    """llama-server holds its whole `-c` for its `-np` slots from the start, however many
    requests are in flight: a batched run is given the server's slots (`Workload.slots`) and
    each slot's share of the context (slots x context = the server's cells); a tightfit run
    its requests' own context and no slots."""
    rows = [_batch_row(make_row, "server", 8, **{"config.backend": "llama-server",
                                                 "config.max_num_seqs": 16,
                                                 "config.extra": {"ctx": 8192}}),
            _batch_row(make_row, "engine", 8)]
    obs, _ = datasets.load_own([_write(tmp_path, rows)], batched=True)
    got = {o.scenario.id.split("-", 1)[1]: (o.scenario.workload.context_tokens,
                                            o.scenario.workload.slots, o.scenario.workload.batch)
           for o in obs}
    assert got == {"server": (512, 16, 8), "engine": (94, None, 8)}
