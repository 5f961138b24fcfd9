"""Quality gates: missing-rate and PSI maths on known inputs (exact values), and the gate logic."""
from __future__ import annotations

import math

import pytest

from tightfit.data import quality
from tightfit.data.quality import Thresholds, check, missing_rate, psi, psi_categorical


def test_missing_rate_counts_null_empty_and_nan():
    assert missing_rate([1, None, "", float("nan")]) == 0.75
    assert missing_rate([0, 0.0, "x", False]) == 0.0
    assert missing_rate([]) == 0.0


def test_psi_two_bins_exact():
    # expected 1..10 with 2 bins: edge at sorted[5] = 6 -> bins {1..5}, {6..10}: 0.5 / 0.5.
    # actual [1, 1, 1, 7] -> 0.75 / 0.25. PSI = 0.25 ln 1.5 + (-0.25) ln 0.5 = 0.25 ln 3.
    got = psi(list(range(1, 11)), [1, 1, 1, 7], bins=2)
    assert got == pytest.approx(0.25 * math.log(3), abs=1e-12)


def test_psi_empty_bin_uses_epsilon_exact():
    # expected [1, 2, 3, 4], 2 bins: edge 3 -> 0.5 / 0.5; actual all in bin 0 -> 1.0 / eps.
    e = 1e-4
    want = 0.5 * math.log(2) + (e - 0.5) * math.log(e / 0.5)
    assert psi([1, 2, 3, 4], [1, 1, 1, 1], bins=2) == pytest.approx(want, abs=1e-12)


def test_psi_is_zero_for_the_same_distribution_and_grows_with_shift():
    base = [float(i) for i in range(100)]
    assert psi(base, base) == 0.0
    small = psi(base, [x + 5 for x in base])
    large = psi(base, [x + 50 for x in base])
    assert 0 < small < large


def test_psi_deciles_exact():
    # 10 bins over 0..99: each decile holds 10%; actual puts 20% in the first decile, 0% in the
    # second, 10% elsewhere -> PSI = 0.1 ln 2 + (eps - 0.1) ln(eps / 0.1).
    base = list(range(100))
    actual = list(range(10)) * 2 + list(range(20, 100))
    e = 1e-4
    want = 0.1 * math.log(2) + (e - 0.1) * math.log(e / 0.1)
    assert psi(base, actual) == pytest.approx(want, abs=1e-12)


def test_psi_categorical_exact():
    # a/b 50/50 -> 75/25 (same numbers as the 2-bin case).
    got = psi_categorical(["a", "b"] * 2, ["a", "a", "a", "b"])
    assert got == pytest.approx(0.25 * math.log(3))


def test_psi_needs_values():
    with pytest.raises(ValueError):
        psi([], [1.0])


def test_field_tiers_come_from_the_schema():
    tiers = {s.name: s.tier for s in quality.field_specs()}
    assert tiers["results.ttft_s_p50"] == "key"
    assert tiers["results.ttft_s_p99"] == "other"
    assert tiers["hardware.gpu_name"] == "na"
    numeric = {s.name for s in quality.field_specs() if s.numeric}
    assert "results.decode_tok_s" in numeric and "config.prefix_caching" not in numeric


def _rows(make_measurement, n, **changes_for_first):
    return [make_measurement(id=str(i), **(changes_for_first if i == 0 else {})) for i in range(n)]


def test_check_passes_a_complete_dataset(make_measurement):
    report = check(_rows(make_measurement, 10))
    assert report.passed and report.rows == 10


def test_key_field_missing_past_half_a_percent_fails(make_measurement):
    # 1 of 100 = 1%: above 0.5% for a key field, within 2% for another.
    key = check(_rows(make_measurement, 100, **{"results.ttft_s_p50": None}))
    assert [c.field for c in key.failures] == ["results.ttft_s_p50"]
    assert key.failures[0].value == 0.01
    other = check(_rows(make_measurement, 100, **{"results.ttft_s_p99": None}))
    assert other.passed
    other3 = check(_rows(make_measurement, 40, **{"results.ttft_s_p99": None}))  # 2.5%
    assert [c.field for c in other3.failures] == ["results.ttft_s_p99"]


def test_failed_runs_do_not_count_as_missing_results(make_measurement):
    rows = _rows(make_measurement, 10, status="failed", error="boom", results=None)
    assert check(rows).passed


def test_na_fields_are_not_gated(make_measurement):
    rows = _rows(make_measurement, 10, **{"hardware.gpu_name": None, "config.block_size": None})
    assert check(rows).passed


def test_psi_gate_against_a_baseline(make_measurement):
    def rows(offset):
        return [make_measurement(id=str(i), **{"results.ttft_s_p50": offset + i / 100})
                for i in range(50)]

    base, same, moved = rows(0.1), rows(0.1), rows(1.0)
    assert check(same, base).passed
    report = check(moved, base)
    assert "results.ttft_s_p50" in [c.field for c in report.failures if c.kind == "psi"]


def test_thresholds_are_the_briefs():
    t = Thresholds()
    assert (t.missing_key, t.missing_other, t.psi_key, t.psi_other) == (0.005, 0.02, 0.10, 0.15)
