"""The predictor subcommands, run in-process through the real dispatcher."""
from __future__ import annotations

import json

import pytest

from tightfit.cli.main import main
from tightfit.predictor.hardware import COPY_OF_PEAK
from tightfit.predictor.scenario import parse_row


def _write(tmp_path, rows):
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_predict_writes_one_line_per_row(tmp_path, row) -> None:
    out = tmp_path / "p.jsonl"
    bad = {"id": "b", "quant": "Q4_0"}
    assert main(["predict", "--input", _write(tmp_path, [row, bad]), "--output", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["x1", "b"] and "error" in lines[1]


def test_predict_reports_non_json_lines(tmp_path, row, capsys) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(row) + "\n{oops\n")
    assert main(["predict", "-i", str(path)]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert out[1]["error"]["field"] == "row"


def test_missing_input_file_is_a_user_error(tmp_path, capsys) -> None:
    assert main(["predict", "--input", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_a_directory_or_binary_input_is_a_user_error(tmp_path, capsys) -> None:
    assert main(["predict", "--input", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe")
    assert main(["predict", "--input", str(blob)]) == 2
    assert "not a text file" in capsys.readouterr().err


def test_a_line_that_is_not_utf8_is_a_row_error(tmp_path, row, capsys) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(json.dumps(row).encode() + b'\n{"id": "caf\xe9"}\n')
    assert main(["predict", "-i", str(path)]) == 0
    good, bad = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "error" not in good
    assert bad["error"]["field"] == "row" and "not UTF-8" in bad["error"]["message"]


def test_an_output_that_cannot_be_written_is_a_user_error(tmp_path, row, capsys) -> None:
    out = tmp_path / "no-such-dir" / "p.jsonl"
    assert main(["predict", "--input", _write(tmp_path, [row]), "--output", str(out)]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_check_gate(tmp_path, row, capsys) -> None:
    path = _write(tmp_path, [row])
    assert main(["check", "--input", path, "--ttft-slo", "5", "--tpot-slo", "0.5"]) == 0
    assert main(["check", "--input", path, "--ttft-slo", "0.001"]) == 1
    assert "FAIL x1" in capsys.readouterr().out
    assert main(["check", "--input", path]) == 2


def test_check_gives_the_predictions_own_reason_for_an_undecided_fit() -> None:
    from tightfit.cli.check import verdict

    band = ("the GPU part (7.81 GiB) is over the card's 7.70 GiB by less than the memory "
            "estimate's error (5%): whether llama.cpp loads it is undecided (fits null); "
            "gpu_layers 40 keeps it under")
    pred = {"id": "a", "fits": None, "fits_reason": band, "peak_memory_gb": 9.0,
            "notes": ["other", band], "ttft_s": 0.1, "tpot_s": 0.01}
    (reason,) = verdict(pred, None, None, False)
    assert reason.endswith(band) and reason.startswith("fit undecided")


def test_check_fails_on_does_not_fit_and_says_what_would(tmp_path, row, capsys) -> None:
    row["quant"] = "F16"
    row["hardware"]["host_memory_gb"] = 8
    path = _write(tmp_path, [row])
    assert main(["check", "--input", path, "--ttft-slo", "100", "--tpot-slo", "100"]) == 1
    out = capsys.readouterr().out
    assert "FAIL x1: does not fit" in out and "of the host's 8 GB RAM" in out
    assert "it needs" in out and "fits (quant)" in out


def test_calibrate_then_predict_local(tmp_path, row, capsys) -> None:
    prof = tmp_path / "device.json"
    assert main(["calibrate", "--output", str(prof), "--size-mb", "16", "--matrix", "512",
                 "--no-engine"]) == 0
    data = json.loads(prof.read_text())
    assert data["engine_runs"] == []
    assert data["device"]["bandwidth_gbps"] > 0.1 and data["device"]["kind"] == "cpu"
    # the copy rate is kept; the bandwidth the predictor uses is its rated equivalent
    assert data["device"]["bandwidth_gbps"] == pytest.approx(
        data["device"]["copy_bandwidth_gbps"] / COPY_OF_PEAK, abs=0.01)
    assert "GB/s copy (rated equivalent" in capsys.readouterr().out
    # the block-format kernel's rate, at its measured share of the profile's GEMM rate; a
    # thread count given for "local" scales the GEMM rate and keeps the share
    device = data["device"]
    # what a copy split over the physical cores streams over a one-thread copy; a thread count
    # given for "local" takes its share of the gain (none at one thread)
    assert 1.0 <= device["threads_bandwidth_gain"] <= device["compute_units"]
    one = parse_row({"id": "x", "hardware": {"name": "local", "cpu_cores": 1},
                     "model": "SmolLM2-135M", "quant": "Q4_0", "engine": "llama.cpp"}).device
    assert one.threads_bandwidth_gain == 1.0 or device["compute_units"] == 1
    # the profile is named by the CPU's model, which tells the predictor its vendor (MKL keeps
    # torch's fp32 products on one thread on an AMD CPU)
    from tightfit.bench.fingerprint import cpu_model_and_flags

    cpu = cpu_model_and_flags()[0]
    assert cpu is None or device["name"] == f"local {cpu} {device['compute_units']}-core"
    assert one.amd_cpu == any(w in (cpu or "") for w in ("AMD", "EPYC", "Ryzen"))
    if device["kernel_gflops"] is None:  # no SIMD block kernels in the lite build here
        from tightfit.lite.runtime import SIMD, library
        assert SIMD[library().tf_simd()] != "avx512-vnni"
        return
    share = device["kernel_gflops"] / (device["fp16_tflops"] * 1000)
    assert 0.01 < share < 5
    # the kernel's streaming rate as a share of a copy on the same threads; a thread count given
    # for "local" keeps it (the same at one thread and two on the Xeon VM)
    assert 0.01 < device["kernel_stream_share"] < 5
    assert one.kernel_stream_share == device["kernel_stream_share"]
    assert one.kernel_gflops / (one.fp16_tflops * 1000) == pytest.approx(share)
    assert one.fp16_tflops == pytest.approx(device["fp16_tflops"] / device["compute_units"])
    row["hardware"] = {"name": "local"}
    row["model"] = {"name": "SmolLM2-135M"}
    row["quant"] = "Q4_1"
    assert main(["predict", "-i", _write(tmp_path, [row])]) == 0
    (out,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()[-1:]]
    assert out["fits"] is True and out["decode_tok_s"] > 0


def test_a_profile_from_before_the_copy_rate_was_kept_reads_its_bandwidth_as_a_copy(
        tmp_path, monkeypatch) -> None:
    """Profiles written before `copy_bandwidth_gbps` existed hold the copy rate as their
    bandwidth; reading them converts it, as a fresh calibration would."""
    from tightfit.predictor.scenario import _local_profile

    prof = tmp_path / "old.json"
    prof.write_text(json.dumps({
        "device": {"name": "local x86_64 2-core", "kind": "cpu", "memory_gb": 23.5,
                   "bandwidth_gbps": 21.0, "fp16_tflops": 0.2, "compute_units": 2,
                   "simd_width": 8, "unified": True, "host_bandwidth_gbps": 21.0,
                   "host_memory_gb": None, "link_gbps": 21.0, "device_count": 1,
                   "cpu_cores": 2, "dies": 1},
        "method": {"bandwidth": "numpy copyto, read+write bytes"}, "engine_runs": []}))
    monkeypatch.setenv("TIGHTFIT_DEVICE_PROFILE", str(prof))
    spec = _local_profile()
    assert spec.copy_bandwidth_gbps == 21.0
    assert spec.bandwidth_gbps == pytest.approx(21.0 / COPY_OF_PEAK, abs=0.01)
    assert spec.fp16_tflops == pytest.approx(0.2) and spec.cpu_cores == 2


def test_calibration_engine_run_corrects_local_tightfit_predictions(tmp_path, row, capsys):
    """Real engine runs (embedded model, native weights: tightfit, lite, and llama.cpp where it is
    installed) are stored in the profile; predicting the same run for "local" then gives what
    was measured, and engines without a run, and float weights, stay uncorrected."""
    prof = tmp_path / "device.json"
    # a 512^3 GEMM: a 128^3 one reads a fraction of the machine's rate, which, with the kernel
    # probe's share of it, put the lite prediction beyond the correction's 4x clip
    assert main(["calibrate", "--output", str(prof), "--size-mb", "16", "--matrix", "512",
                 "--threads", "1"]) == 0
    runs = {r["engine"]: r for r in json.loads(prof.read_text())["engine_runs"]}
    try:
        import llama_cpp  # noqa: F401  (optional: llama.cpp is calibrated where it is installed)
        expected = {"tightfit", "tightfit-lite", "llama.cpp"}
    except ImportError:
        expected = {"tightfit", "tightfit-lite"}
    assert set(runs) == expected
    for r in runs.values():
        assert (r["model"], r["quant"], r["threads"]) == ("smollm2-135m", "q4_1", 1)
        assert r["decode_tok_s"] > 1 and r["prefill_tok_s"] > 1
    run = runs["tightfit"]
    capsys.readouterr()
    rows = []
    for engine, quant in (("tightfit", "Q4_1"), ("llama.cpp", "Q4_1"), ("tightfit", "fp32"),
                          ("tightfit-lite", "Q4_1")):
        r = dict(row, id=f"{engine} {quant}", hardware={"name": "local"},
                 model={"name": "SmolLM2-135M"}, quant=quant, engine=engine,
                 workload={"prompt_tokens": 128, "gen_tokens": 32, "batch": 1})
        if engine == "llama.cpp":  # as calibrate runs it (llama-cpp-python's default)
            r["workload"] = dict(r["workload"], flash_attn=False)
        rows.append(r)
    assert main(["predict", "-i", _write(tmp_path, rows)]) == 0
    out = {o["id"]: o for o in map(json.loads, capsys.readouterr().out.splitlines())}
    tf, lc, f32 = out["tightfit Q4_1"], out["llama.cpp Q4_1"], out["tightfit fp32"]
    assert tf["decode_tok_s"] == pytest.approx(run["decode_tok_s"], rel=0.01)
    assert tf["prefill_tok_s"] == pytest.approx(run["prefill_tok_s"], rel=0.01)
    assert any("calibration run" in n for n in tf["notes"])
    lite = out["tightfit-lite Q4_1"]  # the lite runtime's own run corrects its predictions
    assert lite["decode_tok_s"] == pytest.approx(runs["tightfit-lite"]["decode_tok_s"], rel=0.01)
    if "llama.cpp" in runs:
        assert lc["decode_tok_s"] == pytest.approx(runs["llama.cpp"]["decode_tok_s"], rel=0.01)
    else:  # an engine without a run of its own stays as predicted
        assert not any("calibration run" in n for n in lc["notes"])
    # float weights (memory-bound, not the block kernels' compute): as predicted
    assert not any("calibration run" in n for n in f32["notes"])


def test_local_without_profile_names_the_fix(tmp_path, row, capsys) -> None:
    row["hardware"] = {"name": "this"}
    assert main(["predict", "-i", _write(tmp_path, [row])]) == 1
    assert "tightfit calibrate" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", [["predict"], ["check"], ["calibrate"], ["predictor", "evaluate"]])
def test_help(cmd, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(cmd + ["--help"])
    assert exc.value.code == 0 and "usage" in capsys.readouterr().out


def test_the_documented_example_file(tmp_path) -> None:
    """docs/examples/scenarios.jsonl, as docs/predictor.md shows it: five answers, one error,
    the offloading GTX 1050 Ti bottlenecked by transfer, the tightfit CPU row peaking in load,
    the M2 row not fitting and naming the format that would."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "scenarios.jsonl"
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--input", str(example), "--output", str(out)]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert [i for i, r in rows.items() if "error" in r] == ["bad-quant"]
    assert rows["1050ti-llama3-8b"]["bottleneck"] == "offload_transfer"
    assert 0 < rows["1050ti-llama3-8b"]["offload_fraction"] < 1
    assert rows["cpu-tightfit-gemma3"]["memory"]["peak_phase"] == "load"
    assert rows["m2-llama3.1-8b-f16"]["fits"] is False
    assert "at Q6_K it needs" in rows["m2-llama3.1-8b-f16"]["fits_reason"]
    assert rows["3070-llama3-8b"]["capacity"]["max_context_tokens"] == 8192
    assert main(["check", "--input", str(example), "--ttft-slo", "0.5", "--tpot-slo", "0.05"]) == 1
    # --table: one line a row, as the docs show it, with the reason a row does not fit
    table = tmp_path / "p.txt"
    assert main(["predict", "--input", str(example), "--table", "--output", str(table)]) == 0
    lines = table.read_text().splitlines()
    assert len(lines) == 7 and lines[0].startswith("3070-llama3-8b       fits  5.36 GiB")
    assert "capacity 8192 tokens / 7 seqs" in lines[0] and "offload 49%" in lines[1]
    assert lines[5] == "   fits_reason: " + rows["m2-llama3.1-8b-f16"]["fits_reason"]
    assert lines[6].startswith("bad-quant            error: quant: unknown quant 'Q9_Z'")
    docs = (example.parents[1] / "predictor.md").read_text()
    assert "\n".join(lines[:6]) in docs


def test_a_reader_that_stops_early_is_not_a_crash(tmp_path) -> None:
    """`tightfit check ... | head -1`: the closed pipe ends the command quietly (rc 141, as
    Unix tools do), not with a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "scenarios.jsonl"
    many = tmp_path / "many.jsonl"
    lines = example.read_text().splitlines()
    many.write_text("\n".join(line.replace('"id": "', f'"id": "r{i}-')
                              for i in range(400) for line in lines) + "\n")
    cmd = (f"{sys.executable} -m tightfit check --input {many} --ttft-slo 0.5 "
           "--tpot-slo 0.05 | head -1; echo rc=${PIPESTATUS[0]}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("ok ") and "rc=141" in r.stdout, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr


def test_device_profile_lives_in_tightfits_cache(tmp_path, monkeypatch) -> None:
    """Without TIGHTFIT_DEVICE_PROFILE, `tightfit calibrate` writes where the kernels and the
    predictor's refits go: TIGHTFIT_CACHE, not a fixed ~/.cache."""
    from tightfit.predictor.scenario import device_profile_path

    monkeypatch.delenv("TIGHTFIT_DEVICE_PROFILE")
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path / "elsewhere"))
    assert device_profile_path() == tmp_path / "elsewhere" / "device.json"


def test_calibrate_without_llama_cpp_says_what_is_missing(monkeypatch) -> None:
    """Without llama-cpp-python, the llama.cpp calibration run stops with a message naming the
    optional extra (calibrate prints it and goes on without that engine's correction)."""
    import sys

    from tightfit.cli import calibrate
    from tightfit.errors import TightfitError

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    with pytest.raises(TightfitError, match="llama-cpp-python is not installed"):
        calibrate.engine_run(1, "llama.cpp")


def test_score_batched_reads_the_measured_batches(capsys) -> None:
    """`tightfit predictor score --batched` on the shipped batch sweep: 80 closed-loop runs, a
    decode and a peak-memory observation each, scored per engine and batch; a missing file is a
    user error naming the path."""
    from pathlib import Path

    path = Path(__file__).parents[2] / "data" / "measurements" / "batch-epyc.jsonl"
    assert main(["predictor", "score", "--batched", str(path)]) == 0
    out = capsys.readouterr().out
    assert "observations: 160" in out and "aggregate decode per engine and batch" in out
    assert "tightfit batch 16" in out and "llama.cpp batch 1 " in out
    assert main(["predictor", "score", "--batched", "nope.jsonl"]) == 2
    assert "'nope.jsonl' does not exist" in capsys.readouterr().err


def test_score_scenarios_scores_figures_measured_elsewhere(tmp_path, row, capsys) -> None:
    """`tightfit predictor score --scenarios FILE`: `tightfit predict` input rows with a
    `measured` object (public benchmark tables, a user's runs) scored per metric and per device
    and batch; a row the predictor rejects is counted by its field, a row without figures is
    counted too, and the figures decide the score (a doubled measurement doubles the error)."""
    from tightfit.predictor import predict

    pred = predict([row])[0]["decode_tok_s"]
    good = dict(row, id="m", measured={"decode_tok_s": pred * 1.25})
    far = dict(row, id="f", measured={"decode_tok_s": pred * 2.5})
    bad = dict(row, id="b", quant="Q9_Z", measured={"decode_tok_s": 10.0})
    path = _write(tmp_path, [good, far, bad, dict(row, id="u")])
    assert main(["predictor", "score", "--scenarios", path, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_rows"] == 4 and res["errors"] == {"quant": 1} and res["unmeasured"] == 1
    dec = res["per_metric"]["decode_tok_s"]
    assert dec["n"] == 2 and dec["mape"] == pytest.approx(100 * (0.2 + 0.6) / 2, rel=1e-6)
    assert list(res["per_device_batch"]) == [f"{row['hardware']['name']} batch 1"]
    assert main(["predictor", "score", "--scenarios", path]) == 0
    assert "device, batch" in capsys.readouterr().out
    assert main(["predictor", "score", "--scenarios", "--batched", path]) == 2
    assert "do not go together" in capsys.readouterr().err


def test_score_scenarios_reads_the_shipped_batched_bench_tables(capsys) -> None:
    """docs/examples/batched-bench.jsonl: llama.cpp's public llama-batched-bench tables for a
    DGX Spark and an M2 Ultra (5 models, 3 prompt lengths, 1-32 sequences); every row answers."""
    from pathlib import Path

    path = Path(__file__).parents[2] / "docs" / "examples" / "batched-bench.jsonl"
    assert main(["predictor", "score", "--scenarios", str(path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_rows"] == 180 and not res["errors"] and res["unmeasured"] == 0
    assert res["per_metric"]["decode_tok_s"]["n"] == 180
    assert {"NVIDIA GB10 batch 32", "Apple M2 Ultra batch 1"} <= set(res["per_device_batch"])


def test_mlx_is_llama_cpp_on_metal_with_mlx_storage_and_reads_its_public_runs(capsys) -> None:
    """Engine `mlx`: llama.cpp's Apple profile with MLX's 4-bit storage (4.5 bits, embedding and
    head included), Apple chips and MLX formats only; the llmfit table's 32 MLX runs on an M4 Pro
    (docs/examples/mlx-m4pro.jsonl, whole-request rates, nothing fitted to them) read within 20%
    each."""
    from pathlib import Path

    from tightfit.predictor import predict

    base = {"id": "m", "hardware": {"name": "Apple M4 Pro", "memory_gb": 24},
            "model": "mlx-community/Qwen2.5-7B-Instruct-4bit", "quant": "4bit", "engine": "mlx"}
    mlx, gguf = predict([base, {**base, "engine": "llama.cpp", "quant": "Q4_0"}])
    assert any(n.startswith("engine mlx taken as llama.cpp") for n in mlx["notes"])
    # MLX's head is 4-bit where a Q4_0 file keeps it at Q6_K: less to read a token
    assert mlx["peak_memory_gb"] < gguf["peak_memory_gb"]
    assert mlx["decode_tok_s"] > gguf["decode_tok_s"]
    gpu, k_quant = predict([{**base, "hardware": {"name": "RTX 4090"}},
                            {**base, "quant": "Q4_K_M"}])
    assert gpu["error"]["field"] == "engine" and "Apple silicon" in gpu["error"]["message"]
    assert k_quant["error"]["field"] == "quant" and "'4bit'" in k_quant["error"]["message"]
    # a row that does not fit is offered MLX's formats, not llama.cpp's
    big = predict([{**base, "hardware": {"name": "Apple M2", "memory_gb": 8},
                    "model": "Llama-3.1-8B-Instruct", "quant": "bf16"}])[0]
    assert big["fits"] is False and "at 4bit it needs" in big["fits_reason"]
    vllm, other = predict([{**base, "engine": "vLLM"}, {**base, "engine": "foo"}])
    assert vllm["error"]["field"] == "engine" and "'vLLM' is not modelled" in vllm["error"]["message"]
    assert "ollama / mlx" in other["error"]["message"]
    path = Path(__file__).parents[2] / "docs" / "examples" / "mlx-m4pro.jsonl"
    assert main(["predictor", "score", "--scenarios", str(path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_rows"] == 32 and not res["errors"]
    scored = res["per_metric"]["request_tok_s"]
    assert scored["n"] == 32 and scored["max"] < 20 and scored["mape"] < 10
