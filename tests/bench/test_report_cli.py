"""People-facing output: the compare table and verdicts, sweep reports (PNG + Markdown), the
`tightfit data check` gate, and `--help` of the new commands."""
from __future__ import annotations

import json

import pytest

from tightfit.bench import compare
from tightfit.bench.report import compare_table
from tightfit.cli.main import main
from tightfit.data.store import MeasurementStore


@pytest.fixture(scope="module")
def compare_rows(simulated_compare_rows):
    return simulated_compare_rows({"tightfit": 30.0, "hf": 10.0})


def test_compare_collects_values_ratios_and_verdicts(compare_rows):
    comp = compare.collect(compare_rows, "default", 2)
    assert comp.ratio("decode_tok_s") == pytest.approx(3.0)
    v = comp.verdicts()
    assert v["decode_tok_s"] is True  # 3x >= 1.3x
    assert v["ttft_s"] is False  # same prefill speed: ratio 1 > 0.5
    assert v["load_time_s"] is True  # simulated load takes 0 s
    out = comp.to_json()
    assert out["targets"]["aggregate_tok_s"]["target"] == ">= 2.5x HF"
    json.dumps(out)


def test_compare_table_marks_met_and_missed(compare_rows):
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(compare_table(compare.collect(compare_rows, "default", 2)))
    text = console.export_text()
    assert "decode, 1 stream" in text and "3.00x" in text
    assert "met" in text and "missed" in text and ">= 2.5x HF" in text


def test_report_writes_markdown_and_plots(tmp_path, compare_rows):
    store = MeasurementStore(tmp_path / "m" / "runs.jsonl")
    for m in compare_rows:
        store.append(m)
    out = tmp_path / "report"
    assert main(["bench", "report", str(store.path), "--out", str(out)]) == 0
    md = (out / "README.md").read_text()
    assert md.startswith("# Measurements: runs") and "## Results" in md and "| backend |" in md
    assert "throughput_by_scenario.png" in md
    assert (out / "throughput_by_scenario.png").stat().st_size > 1000


def test_report_without_rows_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["bench", "report", str(tmp_path / "empty.jsonl")]) == 2
    assert "no measurements found" in capsys.readouterr().err


def test_data_check_passes_then_fails_loudly(tmp_path, compare_rows, capsys):
    good = MeasurementStore(tmp_path / "good.jsonl")
    for m in compare_rows:
        good.append(m)
    assert main(["data", "check", str(good.path)]) == 0
    assert "PASSED" in capsys.readouterr().out
    bad = MeasurementStore(tmp_path / "bad.jsonl")
    for i, m in enumerate(compare_rows):
        hw = m.hardware.model_copy(update={"cpu_model": None if i == 0 else m.hardware.cpu_model})
        bad.append(m.model_copy(update={"hardware": hw}))
    assert main(["data", "check", str(bad.path)]) == 1
    out = capsys.readouterr().out
    assert "hardware.cpu_model" in out and "FAIL" in out
    assert main(["data", "check", str(good.path), "--baseline", str(good.path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and any(c["kind"] == "psi" for c in report["checks"])


def test_data_check_flags_unreadable_lines(tmp_path, capsys):
    path = tmp_path / "torn.jsonl"
    path.write_text('{"schema_version": 1\n')
    assert main(["data", "check", str(path)]) == 2  # nothing readable at all
    assert "no measurements" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "--help"], ["bench", "sweep", "--help"],
                                  ["bench", "report", "--help"], ["bench", "run", "--help"],
                                  ["data", "check", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0 and "usage: tightfit" in capsys.readouterr().out


def test_scenarios_listing(capsys):
    assert main(["bench", "scenarios", "--json"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert {"chat", "industrial-inspection", "concurrent-16"} <= set(names)


def test_bench_command_wiring_end_to_end_on_the_simulated_backend(capsys, tmp_path):
    store = tmp_path / "c.jsonl"
    assert main(["bench", "--quick", "--backends", "simulated", "--store", str(store),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["values"]["simulated"]["decode_tok_s"] > 0
    assert set(out["targets"]) == {"aggregate_tok_s", "decode_tok_s", "ttft_s", "peak_rss_mib",
                                   "load_time_s"}
    rows = MeasurementStore(store).read().measurements
    assert len(rows) == 4 and {m.sweep for m in rows} == {"compare"}


def test_bench_unknown_backend_is_one_clear_line(capsys):
    assert main(["bench", "--backends", "tightfit,nope", "--no-record"]) == 2
    assert "unknown backend 'nope'" in capsys.readouterr().err
