"""llama.cpp as a baseline: finding its programs, reading llama-bench's JSON, the llamacpp
compare suite's columns and verdicts, and, where the binaries are built (`make llamacpp`), a real
llama-server driven over HTTP. Without the binaries the real test is skipped (benchmark extra)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tightfit import sysmem
from tightfit.bench import compare, llama_cpp_tools
from tightfit.bench.backends import unavailable_reason
from tightfit.bench.llama_cpp_tools import BenchFigure, parse_llama_bench
from tightfit.bench.report import compare_table
from tightfit.errors import TightfitError

LLAMA_BENCH_JSON = json.dumps([
    {"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 512, "n_gen": 0,
     "avg_ts": 184.2, "stddev_ts": 3.1, "samples_ts": [181.0, 184.0, 187.6]},
    {"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 0, "n_gen": 128,
     "avg_ts": 83.5, "stddev_ts": 1.2, "samples_ts": [82.0, 83.5, 85.0]}])


def test_llama_bench_json_is_read_per_test():
    figs = parse_llama_bench(LLAMA_BENCH_JSON)
    assert [(f.test, f.tok_s, f.repetitions) for f in figs] == [("pp512", 184.2, 3),
                                                                ("tg128", 83.5, 3)]
    with pytest.raises(TightfitError, match="no JSON"):
        parse_llama_bench("error: failed to load model")


def test_binaries_are_found_in_the_named_directory_or_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(llama_cpp_tools, "default_dir", lambda: tmp_path / "nowhere")
    monkeypatch.setenv(llama_cpp_tools.ENV_DIR, str(tmp_path))
    assert llama_cpp_tools.find_binary("llama-server") is None
    with pytest.raises(TightfitError, match=r"llama-server was not found.*make llamacpp"):
        llama_cpp_tools.require_binary("llama-server")
    assert "llama-server was not found" in (unavailable_reason("llama-server") or "")
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert llama_cpp_tools.find_binary("llama-server") == exe
    assert unavailable_reason("llama-server") is None


def test_peak_rss_of_another_process():
    child = subprocess.Popen([sys.executable, "-c",
                              "b = bytearray(64 << 20); import time; time.sleep(5)"])
    try:
        import time
        deadline = time.time() + 5
        while sysmem.peak_rss_mib(child.pid) < 64 and time.time() < deadline:
            time.sleep(0.05)
        assert 64 <= sysmem.peak_rss_mib(child.pid) < 1024
    finally:
        child.kill()
        child.wait()
    assert sysmem.peak_rss_bytes(child.pid) == 0  # gone: no figure rather than our own


def test_llamacpp_suite_judges_each_target_against_its_own_baseline(simulated_compare_rows):
    rows = simulated_compare_rows({"tightfit": 30.0, "tightfit-serve": 20.0, "llamacpp": 25.0,
                                    "llama-server": 40.0, "tightfit-lite": 70.0,
                                    "tightfit-lite-serve": 50.0})
    comp = compare.collect(rows, "default", 2, compare.LLAMACPP_SUITE)
    compare.add_llama_bench(comp, [BenchFigure("pp512", 180.0, 2.0, 3),
                                   BenchFigure("tg128", 60.0, 1.0, 3)], "llama-bench: test")
    assert comp.values["llama-bench"]["decode_tok_s"] == 60.0
    assert comp.ratio("decode_tok_s") == pytest.approx(30.0 / 60.0)  # vs llama-bench tg
    v = comp.verdicts()
    assert v["decode_tok_s"] is False
    assert v["aggregate_tok_s"] is False  # tightfit server at 20 tok/s/stream vs 40
    assert v["peak_rss_mib"] is not None
    assert set(comp.to_json()["targets"]) == {"decode_tok_s", "aggregate_tok_s", "peak_rss_mib"}
    # the same targets on the lite runtime's columns
    lite = comp.verdicts(alt=True)
    assert lite["decode_tok_s"] is True and lite["aggregate_tok_s"] is True
    assert comp.alt_ratio("decode_tok_s") == pytest.approx(70.0 / 60.0)
    assert comp.to_json()["lite_targets"]["aggregate_tok_s"]["column"] == "tightfit-lite-serve"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(compare_table(comp))
    text = console.export_text()
    for head in ("llama-bench", "llama-server", "llama-cpp-python", "tightfit serve",
                 "lite serve", "lite ratio"):
        assert head in text
    assert ">= 1x llama-bench tg" in text and "<= 1.2x llama-cpp-python" in text


def test_llamacpp_suite_runs_each_backend_on_its_scenarios():
    tasks = compare.compare_tasks(None, 2, True, suite=compare.LLAMACPP_SUITE)
    by = {}
    for t in tasks:
        by.setdefault(t.backend, []).append(t.scenario)
        assert t.options.quant == "native"
    assert by["llama-server"] == ["concurrent-16"] and by["tightfit-serve"] == ["concurrent-16"]
    assert by["tightfit-lite-serve"] == ["concurrent-16"] and "decode" in by["tightfit-lite"]
    assert "concurrent-16" not in by["llamacpp"]  # its Python API serves one sequence at a time


@pytest.mark.skipif(llama_cpp_tools.find_binary("llama-server") is None,
                    reason="llama-server not built (make llamacpp; benchmark extra)")
def test_real_llama_server_serves_the_default_model_over_http():
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.llama_server_backend import LlamaServerBackend
    from tightfit.bench.workloads import Arrival, BenchRequest

    with pytest.raises(TightfitError, match="own format"):
        LlamaServerBackend(BackendOptions(quant="int8", threads=1)).load()
    b = LlamaServerBackend(BackendOptions(quant="native", threads=1, max_num_seqs=4,
                                          max_model_len=256))
    b.load()
    try:
        reqs = [BenchRequest(i, tuple(range(300 + i, 320 + i)), 5, None, 0) for i in range(4)]
        ts = b.run(reqs, Arrival("closed", concurrency=4))
        assert [t.output_tokens for t in ts] == [5, 5, 5, 5]
        assert all(t.error is None and t.arrival_s <= t.first_token_s <= t.finished_s for t in ts)
        assert b.server_pid() == b.proc.pid
        assert 20 < sysmem.peak_rss_mib(b.server_pid()) < 2048  # the server's own
    finally:
        b.close()
    assert b.proc.poll() is not None


def test_tightfit_serve_runs_as_its_own_process():
    """`tightfit serve` started the way a user starts it, driven over HTTP from this process."""
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.llama_server_backend import TightfitServeBackend
    from tightfit.bench.workloads import Arrival, BenchRequest

    b = TightfitServeBackend(BackendOptions(quant="native", threads=1, max_num_seqs=4,
                                            max_model_len=256, kv_cache_memory="32MiB"))
    b.load()
    try:
        reqs = [BenchRequest(i, tuple(range(300 + i, 320 + i)), 4, None, i % 2) for i in range(3)]
        ts = b.run(reqs, Arrival("closed", concurrency=3))
        assert [t.output_tokens for t in ts] == [4, 4, 4]
        assert all(t.error is None for t in ts)
        assert b.run_config()["max_num_seqs"] == 4
        assert 100 < sysmem.peak_rss_mib(b.server_pid()) < 4096
    finally:
        b.close()
    assert b.proc.poll() is not None


def test_lite_backends_run_without_torch_in_the_serving_process():
    """The lite runtime in the bench: in process (through the worker, as `tightfit bench` runs
    it) and as `tightfit serve --runtime lite`, whose process must not map libtorch."""
    from pathlib import Path

    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.llama_server_backend import LiteServeBackend
    from tightfit.bench.runner import Callbacks, RunContext, Task, run_tasks
    from tightfit.bench.workloads import Arrival, BenchRequest, Overrides

    got = []
    task = Task("tightfit-lite", BackendOptions(quant="native", threads=1, max_num_seqs=4,
                                                max_model_len=256), "decode",
                Overrides(num_requests=2, output_tokens=4), sweep="test")
    run_tasks([task], RunContext.gather(), Callbacks(result=lambda m, t: got.append(m)))
    (m,) = got
    assert m.status == "ok", m.error
    assert m.config.engine == "tightfit-lite" and m.config.kv_dtype == "f16"
    assert m.results.decode_tok_s > 0 and m.results.peak_rss_mib < 400

    b = LiteServeBackend(BackendOptions(quant="native", threads=1, max_num_seqs=4,
                                        max_model_len=256))
    b.load()
    try:
        maps = Path(f"/proc/{b.server_pid()}/maps").read_text()
        assert "libtorch" not in maps
        reqs = [BenchRequest(i, tuple(range(300 + i, 320 + i)), 4, None, 0) for i in range(3)]
        ts = b.run(reqs, Arrival("closed", concurrency=3))
        assert [t.output_tokens for t in ts] == [4, 4, 4] and all(t.error is None for t in ts)
    finally:
        b.close()
    with pytest.raises(TightfitError, match="own weights"):
        LiteServeBackend(BackendOptions(quant="int8", threads=1)).command(8000)


def test_a_server_that_cannot_start_is_a_clear_error():
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.llama_server_backend import TightfitServeBackend

    b = TightfitServeBackend(BackendOptions(quant="int5-nope", threads=1))
    with pytest.raises(TightfitError, match="tightfit-serve exited with"):
        b.load()


def test_no_script_reaches_every_torch_engine_backend_and_only_them():
    from tightfit.bench.backends.llama_server_backend import TightfitServeBackend

    tasks = compare.compare_tasks(None, 2, True, suite=compare.LLAMACPP_SUITE,
                                  scripted_decode=False)
    for t in tasks:
        torch_engine = t.backend in ("tightfit", "tightfit-serve")
        expected = {"scripted_decode": False} if torch_engine else {}
        assert t.options.extra == expected, t.backend
    serve = next(t for t in tasks if t.backend == "tightfit-serve")
    assert "--no-script" in TightfitServeBackend(serve.options).command(8000)
    default = next(t for t in compare.compare_tasks(None, 2, True, suite=compare.LLAMACPP_SUITE)
                   if t.backend == "tightfit-serve")
    assert "--no-script" not in TightfitServeBackend(default.options).command(8000)
