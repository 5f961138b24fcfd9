"""Bench tests write nothing outside tmp: the fingerprint cache and the default dataset directory
point into a per-session temporary directory."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _bench_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, _bench_tmp):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(_bench_tmp / "cache"))
    monkeypatch.setenv("TIGHTFIT_DATA_DIR", str(_bench_tmp / "measurements"))


def _simulated_compare_rows(speed: dict[str, float]):
    """compare_tasks' runs on the simulated backend, relabelled as each backend in `speed`."""
    from tightfit.bench import compare
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.runner import Callbacks, RunContext, Task, run_tasks
    from tightfit.bench.workloads import Overrides

    rows = []
    for backend, decode in speed.items():
        tasks = [Task("simulated", BackendOptions(extra={"decode_tok_s": decode}), t.scenario,
                      Overrides(num_requests=2, output_tokens=4), sweep="compare")
                 for t in compare.compare_tasks(None, 2, quick=True, backends=("tightfit",))]
        got = []
        run_tasks(tasks, RunContext.gather(), Callbacks(result=lambda m, t: got.append(m)))
        rows += [m.model_copy(update={"config": m.config.model_copy(update={"backend": backend})})
                 for m in got]
    return rows


@pytest.fixture(scope="session")
def simulated_compare_rows():
    """Builds compare rows from the simulated backend: {backend: decode tok/s} -> measurements."""
    return _simulated_compare_rows
