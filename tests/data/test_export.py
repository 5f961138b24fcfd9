"""`tightfit data export`: the JSONL dataset as one Parquet table, read back with pyarrow."""
from __future__ import annotations

import json

import pytest

from tightfit.cli.main import main

pq = pytest.importorskip("pyarrow.parquet")


def test_export_round_trips_every_row_and_field(tmp_path, make_row, capsys):
    src = tmp_path / "m.jsonl"
    rows = [make_row(id="a", run_key="a"),
            make_row(id="b", run_key="b", **{"results.ttft_s_p50": None, "config.threads": 1})]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "m.parquet"
    assert main(["data", "export", str(out), str(src)]) == 0
    assert "2 measurements" in capsys.readouterr().out
    t = pq.read_table(out).to_pylist()
    assert [r["id"] for r in t] == ["a", "b"]
    assert t[0]["results.ttft_s_p50"] == 0.1 and t[1]["results.ttft_s_p50"] is None
    assert t[1]["config.threads"] == 1
    assert json.loads(t[0]["hardware.cpu_flags"]) == ["avx2"]


@pytest.mark.parametrize("argv, needle", [
    (["data", "export", "out.csv"], ".parquet"),
    (["data", "export", "x.parquet", "/nope/none.jsonl"], "/nope/none.jsonl"),
])
def test_export_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
