"""Sweeps: YAML parsing and its error messages, planning, a failing backend that does not stop
the sweep, and resuming (stored runs skipped)."""
from __future__ import annotations

import textwrap

import pytest

from tightfit.bench.sweep import load_sweep, plan
from tightfit.cli.main import main
from tightfit.data.store import MeasurementStore
from tightfit.errors import TightfitError

SIMULATED = """
name: sim
store: out/sim.jsonl
defaults: {backend: simulated, threads: 1, num_requests: 3, output_tokens: 3,
           extra: {fail_prompt_tokens: 40}}
blocks:
  - axes: {scenario: [finance-risk, chat], prompt_tokens: [24, 40]}
"""


def _write(tmp_path, text, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_plan_is_the_product_minus_exclusions_and_impossible_formats(tmp_path):
    path = _write(tmp_path, """
        name: p
        defaults: {scenario: decode}
        blocks:
          - axes: {backend: [tightfit, hf], model: [default, gemma3], threads: [1, 2],
                   block_size: [16, 32]}
            exclude: [{model: gemma3, threads: 1}]
          - axes: {backend: [hf, llamacpp], quant: [fp32]}
        """)
    p = plan(load_sweep(path))
    labels = [t.label for t in p.tasks]
    # tightfit: 2 models x 2 threads x 2 block sizes minus gemma3/t1 (2) = 6; hf ignores
    # block_size (duplicates collapse): 3; block 2: hf fp32 is the same run as before.
    assert sum(t.backend == "tightfit" for t in p.tasks) == 6
    assert sum(t.backend == "hf" for t in p.tasks) == 3
    assert len(labels) == len(set(t.run_key for t in p.tasks)) == 9
    assert p.skipped == ["llamacpp cannot run weight format 'fp32' (only native)"]
    assert load_sweep(path).store_path == (tmp_path / "../measurements/p.jsonl").resolve()


def test_a_block_may_repeat_its_runs_more_than_the_file_says(tmp_path):
    path = _write(tmp_path, """
        name: r
        repeats: 1
        defaults: {scenario: decode, backend: hf}
        blocks:
          - axes: {threads: [1, 2]}
            repeats: 3
          - axes: {threads: [4]}
        """)
    tasks = plan(load_sweep(path)).tasks
    assert sorted((t.options.threads, t.repeat) for t in tasks) == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (4, 0)]
    assert len({t.run_key for t in tasks}) == 7  # each repeat is a run of its own
    with pytest.raises(TightfitError, match="repeats"):
        load_sweep(_write(tmp_path, "name: x\nblocks: [{axes: {backend: [hf], scenario: [chat]}, "
                                     "repeats: 0}]", "bad.yaml"))


@pytest.mark.parametrize("text, message", [
    ("name: x\nblocks: [", "not valid YAML"),
    ("- just a list", "expected a mapping"),
    ("name: x\n", "blocks: Field required"),
    ("name: x\nblocks: [{axes: {backend: [tightfit], scenario: [chat], colour: [red]}}]",
     "unknown key\\(s\\) colour"),
    ("name: x\nblocks: [{axes: {backend: [tpu], scenario: [chat]}}]", "unknown backend 'tpu'"),
    ("name: x\nblocks: [{axes: {backend: [hf], scenario: [poetry]}}]", "unknown scenario 'poetry'"),
    ("name: x\nblocks: [{axes: {backend: [hf], scenario: [chat], quant: [int3]}}]", "int3"),
    ("name: x\nblocks: [{axes: {backend: [hf]}}]", "needs a backend and a scenario"),
    ("name: x\nrepeats: 0\nblocks: [{axes: {backend: [hf], scenario: [chat]}}]", "repeats"),
])
def test_malformed_sweep_files_get_clear_messages(tmp_path, text, message):
    with pytest.raises(TightfitError, match=message):
        load_sweep(_write(tmp_path, text))


def test_missing_sweep_file(tmp_path, capsys):
    assert main(["bench", "sweep", str(tmp_path / "none.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_sweep_records_failures_continues_and_resumes(tmp_path, capsys):
    path = _write(tmp_path, SIMULATED)
    store = MeasurementStore(tmp_path / "out" / "sim.jsonl")
    assert main(["bench", "sweep", str(path)]) == 1  # some runs failed
    rows = store.read().measurements
    assert len(rows) == 4
    failed = [m for m in rows if m.status == "failed"]
    assert len(failed) == 2 and all(m.workload.prompt_tokens_mean == 40 for m in failed)
    assert all("injected failure" in m.error for m in failed)
    capsys.readouterr()

    # Resume: ok runs are skipped, failed ones retried (and fail again).
    main(["bench", "sweep", str(path)])
    assert "4 runs planned, 2 already stored" in capsys.readouterr().err
    assert len(store.read().measurements) == 6

    # With --skip-failed nothing is left to do.
    assert main(["bench", "sweep", str(path), "--skip-failed"]) == 0
    assert "0 to run" in capsys.readouterr().err
    assert len(store.read().measurements) == 6


def test_dry_run_and_limit(tmp_path, capsys):
    path = _write(tmp_path, SIMULATED)
    assert main(["bench", "sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 4 and out[0].startswith("simulated default fp32 t1 finance-risk")
    assert main(["bench", "sweep", str(path), "--limit", "1"]) == 0
    assert len(MeasurementStore(tmp_path / "out" / "sim.jsonl").read().measurements) == 1
