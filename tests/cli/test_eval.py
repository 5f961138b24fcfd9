"""`tightfit eval ppl` runs end to end on a short protocol (2 windows instead of 16)."""
from __future__ import annotations

import json

from tightfit.cli.main import main


def test_eval_ppl_json(capsys) -> None:
    code = main(["eval", "ppl", "--windows", "2", "--quant", "int8", "--json", "--threads", "2"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["windows"] == 2 and out["predicted_tokens"] == 2 * 511
    fp32, int8 = out["results"]
    assert (fp32["quant"], int8["quant"]) == ("fp32", "int8")
    assert fp32["top1_agreement"] == 1.0 and fp32["delta_pct"] == 0.0
    assert 5 < fp32["perplexity"] < 40
    assert abs(int8["delta_pct"]) < 2 and int8["top1_agreement"] > 0.9


def test_eval_ppl_table(capsys) -> None:
    assert main(["eval", "ppl", "--windows", "1", "--quant", "fp32", "--threads", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:2] == ["format", "ppl"]
    assert [line.split()[:3] for line in lines[1:]] == [["fp32", lines[1].split()[1], "+0.00%"]]


def test_eval_ppl_rejects_bad_windows(capsys) -> None:
    assert main(["eval", "ppl", "--windows", "0"]) == 2
    assert "--windows" in capsys.readouterr().err
