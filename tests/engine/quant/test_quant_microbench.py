"""The micro-benchmark runs end to end (tiny settings; its figures are not checked here)."""
from __future__ import annotations

import pytest

from tightfit.engine.quant import microbench


def test_microbench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    microbench.main(["--threads", "1", "--m", "1", "--formats", "fp32", "int8", "int4-g128",
                     "--min-time", "0.005", "--skip-head", "--working-set-mb", "4"])
    out = capsys.readouterr().out
    assert "int4-g128" in out and "down 576x1536" in out
    rows = [line for line in out.splitlines() if line.startswith(("q/o", "k/v", "gate", "down"))]
    assert len(rows) == 4
    assert all(float(v) > 0 for line in rows for v in line.split()[-3:])
