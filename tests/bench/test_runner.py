"""The runner on the model-free simulated backend: worker processes, failures recorded and the
run continuing, crashes, load failures, timeouts, unavailable backends."""
from __future__ import annotations

import pytest

from tightfit.bench import backends as registry
from tightfit.bench.backends.base import BackendOptions
from tightfit.bench.runner import Callbacks, RunContext, Task, run_tasks
from tightfit.bench.workloads import Overrides
from tightfit.errors import TightfitError
from tightfit.lite.runtime import SIMD, library


@pytest.fixture(scope="module")
def ctx():
    return RunContext.gather()


def _task(scenario="finance-risk", prompt=32, timeout=None, **extra):
    return Task("simulated", BackendOptions(threads=1, extra=extra), scenario,
                Overrides(num_requests=4, prompt_tokens=prompt, output_tokens=4), timeout_s=timeout)


def _run(tasks, ctx):
    got, notes = [], []
    run_tasks(tasks, ctx, Callbacks(result=lambda m, t: got.append((t, m)), note=notes.append))
    return got, notes


def test_a_failing_and_a_crashing_run_are_recorded_and_the_rest_continue(ctx):
    opts = dict(fail_prompt_tokens=48, crash_prompt_tokens=64)
    tasks = [_task(prompt=p, **opts) for p in (32, 48, 64, 80)]
    got, notes = _run(tasks, ctx)
    by_prompt = {t.overrides.prompt_tokens: m for t, m in got}
    assert sorted(by_prompt) == [32, 48, 64, 80]
    assert by_prompt[32].status == by_prompt[80].status == "ok"
    assert by_prompt[48].status == "failed" and "injected failure" in by_prompt[48].error
    assert by_prompt[64].status == "failed" and "exited with code 3" in by_prompt[64].error
    assert by_prompt[48].results is None and by_prompt[48].workload.num_requests == 4
    assert any("restarting" in n for n in notes)


def test_ok_rows_are_complete_measurements(ctx):
    (task, m), = _run([_task()], ctx)[0]
    assert m.run_key == task.run_key and m.status == "ok" and m.error is None
    assert m.config.backend == "simulated" and m.config.threads == 1
    assert m.hardware.threads_used == 1 and m.hardware.memory_bandwidth_gbps > 0
    assert m.hardware.load_avg_1m is not None and m.contended is not None
    # the machine's state around this run, probed on its one thread
    assert m.hardware.probe_matmul_gflops > 0 and m.hardware.probe_bandwidth_gbps > 0
    # and a SIMD block kernel's rate (none where the lite runtime's block kernels are plain C)
    if SIMD[library().tf_simd()] == "avx512-vnni":
        assert m.hardware.probe_kernel_gflops > 0 and m.hardware.probe_kernel_stream_gbps > 0
    else:
        assert m.hardware.probe_kernel_gflops is None
        assert m.hardware.probe_kernel_stream_gbps is None
    assert m.model.architecture == "llama" and m.model.n_layers == 30
    assert m.workload.prompt_tokens_mean == 32 and m.results.num_ok == 4
    # simulated: 32 tokens at 500 tok/s to the first token, then 3 more at 50 tok/s
    assert m.results.ttft_s_p50 == pytest.approx(32 / 500)
    assert m.results.tpot_s_p50 == pytest.approx(1 / 50)


def test_a_load_failure_fails_every_run_of_that_load(ctx):
    got, _ = _run([_task(prompt=p, fail_load="no such weights") for p in (32, 40)], ctx)
    assert [m.status for _, m in got] == ["failed", "failed"]
    assert all("load failed" in m.error and "no such weights" in m.error for _, m in got)


def test_a_hung_run_times_out_and_the_next_runs(ctx):
    # 6 s, not 2: the run that does not hang must finish within it too, worker start and the
    # probes around it included, and on a busy 2-core machine that once took over 2 s
    tasks = [_task(prompt=p, timeout=6.0, hang_prompt_tokens=48) for p in (48, 32)]
    got, _ = _run(tasks, ctx)
    status = {t.overrides.prompt_tokens: m for t, m in got}
    assert "timed out after 6 s" in status[48].error
    assert status[32].status == "ok"


def test_unavailable_backends_are_skipped_with_a_message(ctx, monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "ghost", ("nowhere", "Ghost", ("no_such_module_xyz",)))
    got, notes = _run([Task("ghost", BackendOptions(), "chat")], ctx)
    assert got == []
    assert "backend 'ghost' skipped: no_such_module_xyz is not importable" in notes[0]


def test_unknown_backend_and_scenario_are_refused_up_front():
    with pytest.raises(TightfitError, match="unknown backend 'nope'; known: .*hf"):
        Task("nope", BackendOptions(), "chat")
    with pytest.raises(TightfitError, match="unknown scenario"):
        Task("tightfit", BackendOptions(), "nope")


def test_run_keys_identify_the_configuration():
    a, b = _task(prompt=32), _task(prompt=32)
    assert a.run_key == b.run_key
    assert a.run_key != _task(prompt=33).run_key
    assert Task("hf-transformers", BackendOptions(), "chat").backend == "hf"
