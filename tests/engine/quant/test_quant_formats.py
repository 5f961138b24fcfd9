"""Weight-format names: parsing, errors, and the bytes each format costs."""
from __future__ import annotations

import pytest

from tightfit.engine.quant.formats import (
    VALID_FORMATS, WeightFormat, padded_in_features, parse_weight_format, weight_nbytes)
from tightfit.errors import TightfitError


@pytest.mark.parametrize("name", VALID_FORMATS)
def test_every_valid_name_round_trips(name: str) -> None:
    fmt = parse_weight_format(name)
    assert fmt.name == name
    assert parse_weight_format(fmt.name) == fmt


def test_parse_fields() -> None:
    assert parse_weight_format("int4-awq-g64") == WeightFormat("int4", 64, awq=True)
    assert parse_weight_format("int4-g128") == WeightFormat("int4", 128, awq=False)
    assert parse_weight_format("int8") == WeightFormat("int8")
    assert parse_weight_format("fp32").group_size is None
    assert parse_weight_format("native").kind == "native"
    assert parse_weight_format("  INT4-G32 ") == WeightFormat("int4", 32)


@pytest.mark.parametrize("bad", ["int3", "fp16", "int4", "int4-g", "int4-awq", "", "int8-g32"])
def test_unknown_name_names_value_and_lists_valid(bad: str) -> None:
    with pytest.raises(TightfitError) as err:
        parse_weight_format(bad)
    msg = str(err.value)
    assert repr(bad) in msg
    assert "int4-awq-g128" in msg and "fp32" in msg


def test_unsupported_group_size_is_explained() -> None:
    with pytest.raises(TightfitError, match=r"group size 96 is not offered.*32, 64, 128"):
        parse_weight_format("int4-g96")
    with pytest.raises(TightfitError, match="48"):
        WeightFormat("int4", 48)
    with pytest.raises(TightfitError):
        WeightFormat("int8", 32)


def test_nominal_bytes_per_weight() -> None:
    assert parse_weight_format("fp32").bytes_per_weight() == 4.0
    assert parse_weight_format("int8").bytes_per_weight() == 1.0
    # 4-bit codes + a bf16 scale and a bf16 zero per group.
    assert parse_weight_format("int4-g32").bytes_per_weight() == 0.625
    assert parse_weight_format("int4-g64").bytes_per_weight() == 0.5625
    assert parse_weight_format("int4-awq-g128").bytes_per_weight() == 0.53125
    with pytest.raises(TightfitError, match="native"):
        parse_weight_format("native").bytes_per_weight()


def test_exact_bytes_count_padding() -> None:
    assert padded_in_features(576, 128) == 640
    assert padded_in_features(1536, 128) == 1536
    # 576 inputs at group 128 are stored as 640: 320 code bytes + 5 groups x 4 bytes per row.
    assert weight_nbytes("int4-g128", 576, 576) == 576 * (320 + 5 * 4)
    assert parse_weight_format("int4-g128").bytes_per_weight(576) == pytest.approx(340 / 576)
    # Output rows are padded to a multiple of 16 for int4 only.
    assert weight_nbytes("int4-g32", 100, 64) == 112 * (32 + 2 * 4)
    assert weight_nbytes("int8", 100, 64) == 100 * (64 + 2)
    assert weight_nbytes("fp32", 100, 64) == 100 * 64 * 4


def test_formats_does_not_import_torch() -> None:
    # The CLI and the memory predictor parse format names without paying for a torch import.
    import subprocess
    import sys

    code = "import sys, tightfit.engine.quant.formats; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
